"""A persistent completion cache around any LLM (lm-evaluation-harness's CachingLM, on sqlite).

Key = sha256 of the canonical JSON of (schema version, ``llm.identity()``: backend, model,
weights hash or revision, and the request's generation fields: prompt, system, prefix,
max_new_tokens, temperature, stop). ``GenerationRequest.id`` is a label, not an input of the model,
so it is left out: two examples with the same prompt share one completion.

A hit returns the stored ``Completion`` with its original accounting (tokens, seconds) and
``cached=True``, so cost tables stay true on reruns. Misses go to the wrapped LLM in one batch
(duplicates within a batch are generated once) and are stored. If the wrapped LLM fails part-way
and reports the finished completions (``exc.partial``, as the HTTP backend does), those are stored
before the error propagates, so a rerun resumes.

Several sweep workers may share one file: WAL journal (readers never block the writer), a busy
timeout, ``INSERT OR IGNORE`` (first writer wins, identical keys are identical requests) and one
short transaction per batch. A connection is opened per process (and reopened after a fork).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragbench.io import dumps_canonical
from ragbench.llm.base import LLM
from ragbench.types import Completion, GenerationRequest

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 60_000
_SQL_VARS = 500  # keys per SELECT ... IN (...) (sqlite's default limit is 999 or more)


def request_key(identity: dict[str, Any], request: GenerationRequest) -> str:
    """The cache key of one request to one model. Pure; tests pin what changes it."""
    fields = request.to_dict()
    fields.pop("id", None)
    blob = dumps_canonical({"v": SCHEMA_VERSION, "llm": identity, "request": fields})
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


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

    def identity(self) -> dict[str, Any]:
        return self.llm.identity()

    def __repr__(self) -> str:
        return f"CachedLLM({self.llm!r}, path={str(self.path)!r})"

    # ------------------------------------------------------------------ sqlite

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # durable enough in WAL mode, much faster
            conn.execute(
                "CREATE TABLE IF NOT EXISTS completions ("
                " key TEXT PRIMARY KEY, completion TEXT NOT NULL,"
                " identity TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._conn, self._pid = conn, os.getpid()
        return self._conn

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
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")  # take the write lock up front: no upgrade deadlock
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
            except Exception as exc:
                partial = getattr(exc, "partial", None) or {}
                self._store({todo_keys[i]: c for i, c in partial.items()})
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
