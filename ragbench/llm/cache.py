"""A persistent completion cache around any LLM (lm-evaluation-harness's CachingLM, on sqlite).

Key = sha256 of the canonical JSON of (schema version, ``llm.identity()``: backend, model,
weights hash or revision, and the request's generation fields: prompt, system, prefix,
max_new_tokens, temperature, stop). ``GenerationRequest.id`` and ``.variant`` are labels, not
inputs of the model, so they are left out: two examples with the same prompt share one completion.

A hit returns the stored ``Completion`` with its original accounting (tokens, seconds) and
``cached=True``, so cost tables stay true on reruns. Misses go to the wrapped LLM in one batch
(duplicates within a batch are generated once) and are stored. If the wrapped LLM fails part-way
and reports the finished completions (``exc.partial``, as the HTTP backend does), those are stored
before the error propagates, so a rerun resumes; the error's ``partial`` (and ``errors``) are
re-indexed to the caller's batch, cache hits included, so the caller knows every request's fate,
and its ``stored`` says how many completions were stored. An interrupt is no different
(``KeyboardInterrupt``, a SIGTERM's ``SystemExit``: the HTTP backend attaches its finished
completions to it too): the completions paid for before Ctrl-C are not paid for again.

A file that is not a sqlite database, or fails sqlite's ``quick_check``, is moved aside to
``<name>.corrupt-<timestamp>`` (with its ``-wal``/``-shm``) with a warning naming both paths, and
the run continues on a fresh cache: losing cached completions costs compute, failing every record
of every run on one bad file costs the run.

Several sweep workers may share one file: WAL journal (readers never block the writer), a busy
timeout, ``INSERT OR IGNORE`` (first writer wins, identical keys are identical requests) and one
short transaction per batch. A connection is opened per process (and reopened after a fork).

A run sharded over Ray gives each worker a file of its own (never one sqlite file over a network
filesystem); the driver merges them into its cache at the end (``cache_rows``, ``merge_rows``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from filelock import FileLock

from ragbench.io import dumps_canonical
from ragbench.llm.base import LLM, tell_batch
from ragbench.types import Completion, GenerationRequest

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 60_000
_SQL_VARS = 500  # keys per SELECT ... IN (...) (sqlite's default limit is 999 or more)
# sqlite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB. A busy or
# locked database (another sweep worker) is an OperationalError too and must never count.
_CORRUPT_CODES = frozenset({11, 26})
_SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every sqlite 3 database
_CREATE = (
    "CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, completion TEXT NOT NULL,"
    " identity TEXT NOT NULL, created REAL NOT NULL)"
)


class _Corrupt(sqlite3.DatabaseError):
    """Damage found by our own checks: a foreign header, or ``PRAGMA quick_check``."""


def is_corruption(exc: BaseException) -> bool:
    """Whether a sqlite error means the file is damaged (not busy, locked or unwritable)."""
    if isinstance(exc, _Corrupt):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPT_CODES
    text = str(exc).lower()  # raised by hand, or a sqlite3 module without error codes
    return "not a database" in text or "malformed" in text


def request_key(identity: dict[str, object], request: GenerationRequest) -> str:
    """The cache key of one request to one model. Pure; tests pin what changes it."""
    fields = request.to_dict()
    fields.pop("id", None)
    fields.pop("variant", None)  # which variant sent it changes no answer
    blob = dumps_canonical({"v": SCHEMA_VERSION, "llm": identity, "request": fields})
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_rows(path: str | os.PathLike) -> list[tuple[str, str, str, float]]:
    """Every row of the cache file at ``path`` (key, completion JSON, identity JSON, created);
    [] when there is none. What a Ray worker hands its driver (``merge_rows``)."""
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        return conn.execute("SELECT key, completion, identity, created FROM completions").fetchall()
    except sqlite3.OperationalError:  # a file created but never given its table
        return []
    finally:
        conn.close()


def _insert(conn: sqlite3.Connection, rows: Sequence[tuple[str, str, str, float]]) -> None:
    """``rows`` added in one transaction (a key already there keeps its completion); the write
    lock is taken up front (``BEGIN IMMEDIATE``): no upgrade deadlock between processes."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(
            "INSERT OR IGNORE INTO completions (key, completion, identity, created)"
            " VALUES (?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def merge_rows(path: str | os.PathLike, rows: Sequence[tuple[str, str, str, float]]) -> int:
    """Add ``rows`` (``cache_rows`` of other cache files: a Ray run's per-worker caches) to the
    cache at ``path``, in one transaction; a key already there keeps its completion (identical
    keys are identical requests). Returns how many rows were new."""
    if not rows:
        return 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute(_CREATE)
        before = conn.total_changes
        _insert(conn, rows)
        return conn.total_changes - before
    finally:
        conn.close()


class CachedLLM(LLM):
    """``CachedLLM(llm, "cache.sqlite")``: the same interface as ``llm``, with a disk cache."""

    def __init__(self, llm: LLM, path: str | os.PathLike) -> None:
        self.llm = llm
        self.path = Path(path)
        self.name, self.context_window = llm.name, llm.context_window
        self.hits = self.misses = 0
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    # the wrapper is transparent: same tokens, same window, same identity
    def count_tokens(self, text: str) -> int:
        return self.llm.count_tokens(text)

    def prompt_tokens(self, request: GenerationRequest) -> int:
        return self.llm.prompt_tokens(request)

    def identity(self) -> dict[str, object]:
        return self.llm.identity()

    def check(self) -> None:
        self.llm.check()

    def __repr__(self) -> str:
        return f"CachedLLM({self.llm!r}, path={str(self.path)!r})"

    # ------------------------------------------------------------------ sqlite

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            try:
                conn = self._open()
            except sqlite3.DatabaseError as exc:
                if not is_corruption(exc):
                    raise type(exc)(f"completion cache {self.path}: {exc}") from exc
                self._move_aside(exc)
                conn = self._open()
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        """A checked connection: the schema exists and ``quick_check`` passed (a few tenths of a
        second for a 400 MB cache, once per process; a damaged page otherwise surfaces later as
        one failed batch after another)."""
        # Read the header before sqlite does: on a file that is not a database, sqlite deletes
        # the -wal beside it on close, and that file belongs with the evidence moved aside.
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_HEADER))
        except FileNotFoundError:
            head = b""
        # a header shorter than 16 bytes that starts right is a file another process is just
        # creating (sweep workers open one file at once), not damage
        if head and not _SQLITE_HEADER.startswith(head):
            raise _Corrupt(f"file is not a database (it starts with {head[:8]!r})")
        conn = sqlite3.connect(
            self.path,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            # Switching to WAL takes an exclusive lock and sqlite answers "database is locked"
            # at once, without the busy handler, when another process opens the same file at
            # that moment (sweep workers starting together did). One opener at a time; WAL mode
            # is stored in the file, so later openers find it set and skip the switch.
            with FileLock(f"{self.path}.open.lock"):
                if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_CREATE)
            conn.execute("PRAGMA synchronous=NORMAL")  # durable enough in WAL mode, much faster
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise _Corrupt("quick_check: " + "; ".join(problems))
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self, exc: sqlite3.DatabaseError) -> None:
        """Move a damaged cache file (and its -wal/-shm) to ``<name>.corrupt-<timestamp>``."""
        # Sweep workers share the file and may all find it damaged: one moves it, under a lock,
        # and only if the file there now is still damaged (another may have replaced it already).
        with FileLock(f"{self.path}.recover.lock"):
            try:
                self._open().close()
                return
            except sqlite3.DatabaseError as again:
                if not is_corruption(again):
                    raise type(again)(f"completion cache {self.path}: {again}") from again
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
            n = 1
            while aside.exists():
                n += 1
                aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            # the suffixes follow the main file, so sqlite can still open the set moved aside
            for suffix in ("", "-wal", "-shm"):
                src = Path(f"{self.path}{suffix}")
                if src.exists():
                    os.replace(src, f"{aside}{suffix}")
            log.warning(
                "completion cache %s is not a usable sqlite database (%s: %s); moved it to %s "
                "and starting a fresh cache",
                self.path,
                type(exc).__name__,
                exc,
                aside,
            )

    def _lookup(self, keys: Sequence[str]) -> dict[str, Completion]:
        found: dict[str, Completion] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock:
            conn = self._connection()
            for i in range(0, len(unique), _SQL_VARS):
                part = unique[i : i + _SQL_VARS]
                marks = ",".join("?" * len(part))
                rows = conn.execute(
                    f"SELECT key, completion FROM completions WHERE key IN ({marks})", part
                ).fetchall()
                found.update((k, Completion.from_json(v)) for k, v in rows)
        return found

    def _store(self, items: dict[str, Completion]) -> None:
        if not items:
            return
        identity = dumps_canonical(self.llm.identity())
        now = time.time()
        rows = [(k, c.to_json(), identity, now) for k, c in items.items()]
        with self._lock:
            _insert(self._connection(), rows)

    def _reindex(
        self,
        exc: BaseException,
        keys: list[str],
        todo_keys: list[str],
        found: dict[str, Completion],
    ) -> None:
        """Turn the wrapped LLM's ``partial``/``errors`` (indices into the misses it was given)
        into indices of the caller's batch, hits included: the caller then gives each request
        its completion or its own error and resends none of them."""
        done = {todo_keys[i]: c for i, c in getattr(exc, "partial", {}).items()}
        inner_errors = getattr(exc, "errors", None)
        failed = {todo_keys[i]: e for i, e in (inner_errors or {}).items()}
        partial: dict[int, Completion] = {}
        errors: dict[int, Exception] = {}
        for j, k in enumerate(keys):
            if k in found:
                partial[j] = dataclasses.replace(found[k], cached=True)
            elif k in done:
                partial[j] = done[k]
            elif k in failed:
                errors[j] = failed[k]
        tell_batch(exc, partial=partial)
        if inner_errors is not None:
            tell_batch(exc, errors=errors)

    def __len__(self) -> int:
        with self._lock:
            return self._connection().execute("SELECT COUNT(*) FROM completions").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ generation

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        if not any(r.cacheable for r in requests):  # past the cache: answered, never stored
            return self.llm.generate(requests)
        if not all(r.cacheable for r in requests):
            return self._mixed(requests)
        identity = self.llm.identity()
        keys = [request_key(identity, r) for r in requests]
        found = self._lookup(keys)
        # one generation per distinct missing key, in first-occurrence order
        todo: dict[str, GenerationRequest] = {}
        for k, r in zip(keys, requests, strict=True):
            if k not in found and k not in todo:
                todo[k] = r
        fresh: dict[str, Completion] = {}
        if todo:
            todo_keys = list(todo)
            try:
                out = self.llm.generate(list(todo.values()))
            except BaseException as exc:  # an interrupt's finished completions are kept too
                partial = getattr(exc, "partial", None)
                if partial is not None:
                    self._store({todo_keys[i]: c for i, c in partial.items()})
                    self._reindex(exc, keys, todo_keys, found)
                    tell_batch(exc, stored=len(partial))
                raise
            fresh = dict(zip(todo_keys, out, strict=True))
            self._store(fresh)
        results = []
        for k in keys:
            if k in fresh:  # the first occurrence of a generated key; repeats count as hits
                results.append(fresh.pop(k))
                found[k] = results[-1]
                self.misses += 1
            else:
                results.append(dataclasses.replace(found[k], cached=True))
                self.hits += 1
        return results

    def _mixed(self, requests: list[GenerationRequest]) -> list[Completion]:
        """A call mixing cacheable requests with ones past the cache: each group on its own. A
        failure's ``partial`` would index one group, not the call: it is dropped, so the caller
        finds each request's own outcome."""
        direct = [i for i, r in enumerate(requests) if not r.cacheable]
        cached = [i for i, r in enumerate(requests) if r.cacheable]
        out: list[Completion | None] = [None] * len(requests)
        try:
            for group, done in (
                (direct, self.llm.generate([requests[i] for i in direct])),
                (cached, self._generate([requests[i] for i in cached])),
            ):
                for i, completion in zip(group, done, strict=True):
                    out[i] = completion
        except BaseException as exc:
            if getattr(exc, "partial", None) is not None:
                exc.partial = None  # type: ignore[attr-defined]
            raise
        return out  # type: ignore[return-value]
