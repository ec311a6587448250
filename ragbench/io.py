"""Small I/O helpers used everywhere: atomic writes, JSONL with file:line errors, fingerprints,
the one-line ``error: ...`` exit the commands use for user errors, and SIGTERM turned into an
exit that unwinds (``sigterm_exits``), so a stopped writer leaves nothing half-written."""

from __future__ import annotations

import codecs
import glob
import hashlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ragbench.secrets import redact_text

if TYPE_CHECKING:
    import typer

log = logging.getLogger(__name__)


class InputFileError(ValueError):
    """A malformed input file; the message names the file, the line and the field."""

    def __init__(
        self, path: str | os.PathLike, line: int | None, message: str, field: str | None = None
    ):
        where = f"{path}:{line}" if line is not None else str(path)
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")
        self.path, self.line, self.field = str(path), line, field
        self.message = message


_UMASK = os.umask(0)
os.umask(_UMASK)


def temp_prefix(path: Path) -> str:
    """The start of the temporary file's name a writer of ``path`` uses beside it:
    ``.<name>.<pid>.`` (mkstemp adds 8 characters of [a-z0-9_] and ``.tmp``). The PID lets a
    later writer tell a temporary file whose writer died from one being written now."""
    return f".{path.name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of ``path`` (:func:`temp_prefix`'s names, beside it) that a
    writer killed mid-write left behind: only plain files of exactly that pattern, and only when
    the PID in the name is not a running process here (a live writer's file is kept). Returns
    what it removed."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.") + r"(\d+)\.[a-z0-9_]{8}\.tmp")
    removed: list[Path] = []
    try:
        candidates = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        match = pattern.fullmatch(tmp.name)
        if match is None or tmp.is_symlink() or not tmp.is_file():
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or _alive(pid):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
        log.warning("%s: removed %s, left by a writer that was stopped", path.parent, tmp.name)
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename: never half-written.
    Temporary files of ``path`` that a killed writer left are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; shared reports need normal modes
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def dumps_canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: str | os.PathLike, rows: Iterable[object]) -> Path:
    """Atomically write rows (dicts, or objects with ``to_json``) one per line, canonical JSON."""
    lines = [r.to_json() if hasattr(r, "to_json") else dumps_canonical(r) for r in rows]
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def utf8_error(
    path: str | os.PathLike, data: bytes, exc: UnicodeDecodeError, first_line: int = 1
) -> InputFileError:
    """The ``InputFileError`` for ``data`` (the bytes of ``path`` from line ``first_line`` on)
    failing to decode: the line and column of the first bad byte, and the byte itself."""
    line = data.count(b"\n", 0, exc.start) + first_line
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1  # bytes, 1-based
    bad = data[exc.start : exc.start + 1].hex()
    return InputFileError(
        path, line, f"not valid UTF-8 (byte 0x{bad} at column {column}); save the file as UTF-8"
    )


def strip_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 byte order mark (Windows editors write one; it is never
    content). Lines and columns reported after stripping are the ones an editor shows."""
    return data[len(codecs.BOM_UTF8) :] if data.startswith(codecs.BOM_UTF8) else data


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file's content, without a leading byte order mark (:func:`strip_bom`);
    bytes that are not valid UTF-8 raise an ``InputFileError`` naming the file, line and column
    instead of a bare ``UnicodeDecodeError``."""
    path = Path(path)
    require_file(path)
    data = strip_bom(path.read_bytes())
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise utf8_error(path, data, exc) from None


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's content, or None when it is missing or unreadable: for a file read for
    what it says (a run folder's manifest, by the analysis), never to be written back."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def require_file(path: Path) -> None:
    """``FileNotFoundError`` naming ``path`` when it is missing, ``InputFileError`` when it is a
    folder (where a file is read; not ``[Errno 21] Is a directory``)."""
    if path.is_dir():
        raise InputFileError(path, None, "is a folder; expected a file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")


NOT_JSON_LINES = (
    "this looks like a JSON document, not JSON Lines: write one JSON object per line, "
    "each whole on its line"
)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, object]]]:
    """Yield (line_number, object) for each non-blank line; malformed JSON (or bytes that are
    not UTF-8) names file and line. A byte order mark opening the file is skipped. A first line
    that is ``{`` or ``[`` alone (a pretty-printed file) or opens an array is reported as a JSON
    document given for JSON Lines."""
    path = Path(path)
    require_file(path)
    first = True
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                raw = strip_bom(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise utf8_error(path, raw, exc, lineno) from None
            if not line.strip():
                continue
            text = line.rstrip("\r\n")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                msg = f"invalid JSON ({exc.msg} at column {exc.colno})"
                opened = text.strip()  # a pretty-printed document opens with "{" or "[" alone
                if first and (opened in ("{", "[") or opened.startswith("[")):
                    msg += f"; {NOT_JSON_LINES}"
                raise InputFileError(path, lineno, msg) from None
            if not isinstance(obj, dict):
                msg = f"expected a JSON object, got {type(obj).__name__}"
                if first and isinstance(obj, list):
                    msg += f"; {NOT_JSON_LINES}"
                raise InputFileError(path, lineno, msg)
            first = False
            yield lineno, obj


# --------------------------------------------------------------------------- YAML

# Nodes a YAML document may hold once its aliases are expanded. A config is a few hundred; nine
# levels of nine-fold aliases (a "billion laughs") are 387 million, which every later walk over
# the loaded object (secret collection, validation) would visit one by one.
YAML_MAX_NODES = 100_000


class YAMLInputError(yaml.MarkedYAMLError):
    """A document PyYAML reads but ragbench refuses: a repeated key, aliases that expand too far."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (PyYAML keeps the later
    one silently); merge keys (``<<: *base``) may still be overridden."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> object:
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode
                ):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise YAMLInputError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {seen[key]}); keep one",
                        key_node.start_mark,
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes in ``root`` with every alias expanded (a shared node counts each time it is used),
    counted without expanding: sizes are memoised per node. Past ``limit``, or a node that
    contains itself, raises ``YAMLInputError`` at the alias."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise YAMLInputError(
                None, None, "an alias refers to a node that contains it", node.start_mark
            )
        open_.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                raise YAMLInputError(
                    None,
                    None,
                    f"its aliases expand to more than {limit:,} values; write the values out "
                    "or use fewer nested aliases",
                    child.start_mark,
                )
        open_.discard(key)
        sizes[key] = total
        return total

    return size(root)


def load_yaml(text: str, max_nodes: int = YAML_MAX_NODES) -> object:
    """``yaml.safe_load`` for files people write: a repeated key in a mapping is an error, and
    aliases may expand to at most ``max_nodes`` values (checked on the node graph, before any
    object is built). Errors are ``yaml.MarkedYAMLError``s with a ``problem_mark``; see
    :func:`yaml_problem` for one line."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, max_nodes)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_problem(exc: yaml.YAMLError) -> tuple[int | None, str]:
    """The 1-based line and a one-line description of a YAML error (PyYAML's own ``str`` spans
    several lines, quoting the text with a caret)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    text = f"{problem} ({context})" if context else str(problem)
    return line, " ".join(text.split())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- CLI user errors

# What a command reports as one ``error: ...`` line instead of a traceback: bad values and names
# (ValueError covers InputFileError, ConfigError and the registries' UnknownNameError) and bad
# paths. Anything else is a bug and keeps its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)
USER_ERROR_EXIT = 2  # as click's usage errors; an uncaught exception exits 1
ALL_FAILED_EXIT = 1  # `ragbench run`: every record failed
TERMINATED_EXIT = 128 + signal.SIGTERM  # 143: the shell's code for a process SIGTERM ended

# the exit codes, as `ragbench --help` and `ragbench run --help` show them (typer's help prints
# each paragraph as one reflowed line)
EXIT_CODES_HELP = "\n\n".join(
    [
        "Exit codes:",
        "0: done (a run whose records partly failed says how many; rerun it to retry them).",
        f"{ALL_FAILED_EXIT}: a run in which every record failed (its manifest says failed; one "
        "`error: ...` line names the most frequent error), or a bug (a traceback).",
        f"{USER_ERROR_EXIT}: bad input, reported as one `error: ...` line naming the file and "
        "line or key (a config, dataset or sweep file, an unknown name, a bad option), or a "
        "failed preflight (the server unreachable, long-context prompts over the window, the run "
        "folder held by another process).",
        f"{TERMINATED_EXIT}: stopped by SIGTERM (130: by Ctrl-C); what finished is kept, a run's "
        "manifest says interrupted, and the same command run again resumes.",
    ]
)


def cli_error(exc: BaseException, code: int = USER_ERROR_EXIT) -> typer.Exit:
    """Print ``error: <exc>`` (credentials masked) to stderr; returns the ``typer.Exit`` to raise (``from None``)."""
    import typer

    typer.echo(f"error: {redact_text(str(exc))}", err=True)
    return typer.Exit(code=code)


@contextmanager
def user_errors(*extra: type[Exception], code: int = USER_ERROR_EXIT) -> Iterator[None]:
    """Turn ``USER_ERRORS`` (and ``extra``) raised inside the block into ``cli_error``."""
    try:
        yield
    except (*USER_ERRORS, *extra) as exc:
        raise cli_error(exc, code) from None


# --- SIGTERM ------------------------------------------------------------------------------------


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread as Ctrl-C raises ``KeyboardInterrupt`` (exit 143)."""


@contextmanager
def sigterm_exits(replace: bool = True, resume: str = "") -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` (``SystemExit(143)``) in the main
    thread, as Ctrl-C raises ``KeyboardInterrupt``: ``finally`` blocks, locks (their owner file
    removed), atomic writes (their temporary file removed) and the runner's ``interrupted``
    manifest unwind, where the default action ends the process mid-write. The one way every
    command and the runner install it.

    Once raised, a further SIGTERM (a process group's, a sweep's second) is ignored while the
    block unwinds: it must not cut the cleanup short. An ignored SIGTERM stays ignored; outside
    the main thread (where Python runs no handler) nothing is installed. ``replace=False`` (the
    runner, in a notebook's kernel or a script): only over the default action, never over a
    handler the program set. ``resume``: a command's one line, on stderr, when SIGTERM ends the
    block (``interrupted by SIGTERM: <resume>``)."""
    current = signal.getsignal(signal.SIGTERM)  # None: set outside Python, left alone
    skip = current in (None, signal.SIG_IGN) or (not replace and current is not signal.SIG_DFL)
    if skip or threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def terminated(signum: int, frame: object) -> None:
        if not raised:  # the first: unwind; the rest: the unwinding goes on
            raised.append(signum)
            raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except Terminated:
        if resume:
            print(f"interrupted by SIGTERM: {resume}", file=sys.stderr, flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, current)
