"""One writer per folder: an exclusive lock that names its holder.

The lock is an OS file lock (``filelock``: ``flock`` on Unix), so the kernel releases it when its
holder dies, kill -9 included: a dead holder's lock is taken over, never waited on. Beside it an
``.owner`` file says who holds it (PID, host, start time) for the message a second process gets;
the holder removes it on a clean exit, so finding one on acquiring means the last holder died.
A holder refused before writing anything removes the folder it created (``discard_if_empty``);
a waiter that locked the removed file notices and locks the new one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from ragbench.io import atomic_write_text

log = logging.getLogger(__name__)
LOCK_NAME = ".lock"


# the owner files of the locks this process holds (``drop_owner_files``)
_held: set[Path] = set()


def drop_owner_files() -> None:
    """Remove the owner files of the locks this process holds: for a process about to end
    without unwinding (a stopped sweep's pool worker ends with ``os._exit``), so no stale owner
    is left to be taken for a holder that died. The OS releases the locks themselves."""
    for path in list(_held):
        path.unlink(missing_ok=True)


class LockHeldError(RuntimeError):
    """Another live process holds the lock; the message names it."""


def _owner(path: Path) -> dict[str, object]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _describe(owner: dict[str, object]) -> str:
    if not owner:
        return "another process"
    return f"PID {owner.get('pid')} on {owner.get('host')} (since {owner.get('started')})"


class FolderLock:
    """``with FolderLock(folder, what="run"):`` holds ``folder/.lock`` for the block.

    ``wait=False``: a held lock raises ``LockHeldError`` at once; ``wait=True`` blocks until the
    holder finishes."""

    def __init__(self, folder: str | os.PathLike, what: str = "folder", wait: bool = False):
        from filelock import FileLock

        self.folder = Path(folder)
        self.what = what
        self.wait = wait
        self.path = self.folder / LOCK_NAME
        self.owner_path = self.folder / (LOCK_NAME + ".owner")
        self._lock = FileLock(str(self.path))

    def __enter__(self) -> FolderLock:
        from filelock import Timeout

        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                self._lock.acquire(timeout=0)
            except FileNotFoundError:  # its holder discarded the folder as we opened it
                continue
            except Timeout:
                holder = _describe(_owner(self.owner_path))
                if not self.wait:
                    raise LockHeldError(
                        f"{self.folder}: {holder} is already writing this {self.what}; wait "
                        f"for it (--wait) or use another output_dir"
                    ) from None
                log.warning("waiting for %s to finish the %s in %s", holder, self.what, self.folder)
                try:
                    self._lock.acquire()
                except FileNotFoundError:
                    continue
            if self._holds_the_file():
                break
            self._lock.release()  # the holder we waited for discarded the folder: start over
        stale = _owner(self.owner_path)
        if stale:
            log.warning(
                "%s: taking over the lock of %s, which ended without releasing it",
                self.folder,
                _describe(stale),
            )
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        atomic_write_text(self.owner_path, json.dumps(owner) + "\n")
        _held.add(self.owner_path)
        return self

    def _holds_the_file(self) -> bool:
        """Whether the locked descriptor is still the file at ``self.path``: a holder that
        discards its folder (``discard_if_empty``) unlinks the file a waiter may have locked."""
        fd = getattr(getattr(self._lock, "_context", None), "lock_file_fd", None)
        try:
            here = self.path.stat()
            held = os.fstat(fd) if isinstance(fd, int) else here
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)

    def discard_if_empty(self) -> bool:
        """Remove the folder if it holds nothing but this lock, while holding it: a command
        refused before it wrote anything leaves no empty folder behind. Returns whether it did."""
        names = {p.name for p in self.folder.iterdir()}
        if not names <= {self.path.name, self.owner_path.name}:
            return False
        _held.discard(self.owner_path)
        self.owner_path.unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:  # something arrived meanwhile: keep it
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        _held.discard(self.owner_path)
        self.owner_path.unlink(missing_ok=True)
        self._lock.release()
