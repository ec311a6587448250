"""A pipeline under test named as ``"module:attr"``: found, loaded (again when its file changed),
identified, and called with a deadline.

- ``resolve(target)``: the object ``attr`` names in ``module``. The module is imported from
  ``sys.path``, else from the working directory, else from the folders ``imports_from`` adds
  (the config's folder). A module whose file changed since it was imported is reloaded, so a
  pipeline edited between two runs of one process runs its new code.
- ``identity(target)``: what makes its answers what they are, for the parameter point (work keys
  and label): a ``__version__`` / ``version`` string the object or its module exposes, else
  ``sha256:<16 hex>`` of the module's file.
- ``call_with_deadline(fn, seconds)``: ``fn()`` in a daemon thread; past the deadline a
  ``PipelineTimeout`` (the call is left to finish in the background: Python cannot stop a thread).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_folders: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "pipeline_folders", default=()
)
_loaded: dict[str, str] = {}  # module name -> sha256 of its file when it was (re)loaded


class PipelineTimeout(TimeoutError):
    """The pipeline did not answer within its ``timeout``."""


@contextlib.contextmanager
def imports_from(*folders: str | os.PathLike) -> Iterator[None]:
    """Targets resolved inside the block may also live in ``folders`` (a config's folder)."""
    token = _folders.set(_folders.get() + tuple(str(f) for f in folders))
    try:
        yield
    finally:
        _folders.reset(token)


def check_target(owner: str, target: object) -> None:
    if not isinstance(target, str) or not TARGET.match(target):
        raise ValueError(
            f"{owner}: target must be 'module:attribute' (e.g. 'mypkg.rag:answer'), got {target!r}"
        )


def _file_sha(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextlib.contextmanager
def _searched(extra: list[str]) -> Iterator[None]:
    """``extra`` folders on sys.path for the block; sys.path is left as it was."""
    added = [f for f in extra if f not in sys.path]
    sys.path[:0] = added
    try:
        importlib.invalidate_caches()
        yield
    finally:
        for folder in added:  # the module stays imported
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def _import(name: str) -> Any:
    """Import ``name`` from sys.path, the working directory, or the ``imports_from`` folders."""
    extra = [os.getcwd(), *_folders.get()]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.split(".")[0]
        if exc.name not in (name, top) or not extra:
            raise
    with _searched(extra):
        return importlib.import_module(name)


def load_module(name: str) -> Any:
    """The module ``name``, reloaded when its file changed since this process loaded it (found
    where it was imported from: sys.path, the working directory or the ``imports_from``
    folders). A module imported afresh (another one of that name was dropped from
    ``sys.modules``) is not reloaded: it is new."""
    fresh = name not in sys.modules
    module = _import(name)
    path = getattr(module, "__file__", None)
    sha = _file_sha(path)
    if not fresh and name in _loaded and sha is not None and _loaded[name] != sha:
        with _searched([os.getcwd(), *_folders.get()]):
            module = importlib.reload(module)
    if sha is not None:
        _loaded[name] = sha
    return module


def resolve(target: str, owner: str = "pipeline") -> tuple[Any, object]:
    """(the object ``target`` names, its module); errors say what could not be found."""
    check_target(owner, target)
    module_name, _, attr = target.partition(":")
    try:
        module = load_module(module_name)
    except Exception as exc:
        raise ValueError(
            f"{owner}: cannot import {module_name!r} for target {target!r} "
            f"({type(exc).__name__}: {exc}); the module must be importable from sys.path, "
            "the working directory or the config's folder"
        ) from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in vars(module) if not n.startswith("_"))[:12]
            raise ValueError(
                f"{owner}: {module_name!r} has no attribute {attr!r} (target {target!r}); "
                f"it defines {names}"
            )
        obj = getattr(obj, part)
    return obj, module


def identity(target: str, owner: str = "pipeline") -> str:
    """The target's ``__version__`` / ``version`` (its own, else its module's), else
    ``sha256:<16 hex>`` of its module's file."""
    obj, module = resolve(target, owner)
    for holder in (obj, module):
        for name in ("__version__", "version"):
            value = getattr(holder, name, None)
            if isinstance(value, str) and value.strip():
                return value.strip()
    sha = _file_sha(getattr(module, "__file__", None))
    if sha is None:
        raise ValueError(
            f"{owner}: target {target!r} has no __version__ and its module has no file to "
            "hash; set the strategy's `version` parameter"
        )
    return f"sha256:{sha[:16]}"


def call_with_deadline(fn: Callable[[], Any], seconds: float | None, what: str) -> Any:
    """``fn()``, or ``PipelineTimeout`` when it has not returned within ``seconds`` (None: wait)."""
    if seconds is None:
        return fn()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"pipeline {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise PipelineTimeout(f"pipeline {what} did not answer within {seconds:g} s (timeout)")
    if "error" in box:
        raise box["error"]
    return box["value"]
