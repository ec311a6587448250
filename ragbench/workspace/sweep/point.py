"""One sweep point: its folder's lock, its execution with papermill, its markers.

Runs in a pool worker, a Ray task or the sweep process itself (``sweep/run.py`` plans the grid and
hands each point here as a plain dict, the job). A point executes under ``locks.FolderLock`` on
its folder and looks at its markers again once the lock is its own: that second look is what
makes two concurrent sweeps of one spec execute it once. Markers are written atomically:
``done.json`` or ``failed.json``, with the point's parameters (credentials masked), its status,
seconds and ``finished_at`` (ISO 8601 UTC), so a later sweep can report the first completion.
A point that runs again first removes the temporary files an interrupted atomic write left in its
folder (:func:`remove_stale_temps`), once the lock is its own: no live writer can own them then.
"""

from __future__ import annotations

import json
import logging
import re
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, cast

from ragbench import secrets
from ragbench.io import atomic_write_text
from ragbench.locks import LOCK_NAME, FolderLock, LockHeldError
from ragbench.workspace.kernels import execute_notebook

log = logging.getLogger(__name__)

DONE, FAILED = "done.json", "failed.json"


class Job(TypedDict):
    """One point of a sweep, as the sweep plans it (``run._plan``) and a worker runs it."""

    point_id: str
    params: dict[str, object]  # what is stored and shown (credentials redacted)
    parameters: dict[str, object]  # what the notebook gets, credentials included
    notebook: str
    point_dir: str
    output_notebook: str
    kernel: str
    cwd: str
    # set when it is handed to a worker: wait for a held point, take a recorded failure, and
    # the failed marker's mtime when planned (a later one is news)
    wait: NotRequired[bool]
    accept_failed: NotRequired[bool]
    failed_seen: NotRequired[int | None]


class PointResult(TypedDict, total=False):
    """What running (or finding recorded) one point gave: ``run.PointOutcome``'s fields."""

    status: Literal["done", "failed", "held"]
    holder: str  # held: who holds the point's lock
    cell: int | None
    exec_count: int | None
    error: str | None
    traceback: str
    seconds: float
    finished_at: str | None
    skipped: bool


# the temporary name of ``io.atomic_write_bytes``: mkstemp(prefix=".<name>.<pid>.", suffix=".tmp"),
# whose random part is 8 characters of [a-z0-9_]
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def execute_point(job: Job) -> PointResult:
    """Run one point under its folder's lock; never raises. A point another live process holds
    comes back ``held`` (``job["wait"]``: wait for it instead); a point that has a marker by the
    time the lock is ours comes back as recorded, skipped."""
    # a worker does not share the sweep's memory: remember the credentials here too, so that
    # error texts quoting them are masked
    secrets.collect(job["parameters"])
    point_dir = Path(job["point_dir"])
    try:
        lock = FolderLock(point_dir, what="sweep point", wait=job["wait"]).__enter__()
    except LockHeldError:
        return {"status": "held", "holder": _holder(point_dir)}
    try:
        return recorded(job, job["accept_failed"]) or _run_point(job)
    finally:
        lock.__exit__(None, None, None)


def _run_point(job: Job) -> PointResult:
    from papermill.exceptions import PapermillExecutionError

    point_dir, out_nb = Path(job["point_dir"]), Path(job["output_notebook"])
    remove_stale_temps(point_dir)
    for done_or_failed in (DONE, FAILED):
        (point_dir / done_or_failed).unlink(missing_ok=True)
    start = time.perf_counter()
    result: PointResult = {"status": "done", "cell": None, "exec_count": None, "error": None}
    try:
        execute_notebook(
            job["notebook"],
            str(out_nb),
            parameters=job["parameters"],
            kernel_name=job["kernel"],
            cwd=job["cwd"],
            progress_bar=False,
        )
    except PapermillExecutionError as exc:
        result.update(
            {
                "status": "failed",
                "cell": _error_cell(out_nb, exc.cell_index),
                "exec_count": exc.exec_count,
                "error": secrets.redact_text(f"{exc.ename}: {exc.evalue}"),
            }
        )
    except Exception as exc:  # kernel died, missing kernel, ...: still only this point fails
        result.update(
            {"status": "failed", "error": secrets.redact_text(f"{type(exc).__name__}: {exc}")}
        )
        result["traceback"] = secrets.redact_text(traceback.format_exc())
    result["seconds"] = round(time.perf_counter() - start, 3)
    result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    marker: dict[str, object] = {
        "point_id": job["point_id"],
        "params": job["params"],
        "notebook": out_nb.name,
    }
    marker |= result
    name = DONE if result["status"] == "done" else FAILED
    atomic_write_text(point_dir / name, json.dumps(marker, indent=2, default=str) + "\n")
    return result


def remove_stale_temps(point_dir: Path) -> list[Path]:
    """Remove the temporary files of atomic writes (the executed notebook, a marker) that an
    interrupted execution left directly in ``point_dir``; logs each. Only names of
    :data:`TEMP_NAME`'s pattern, only plain files; call it holding the point's lock."""
    removed = []
    for path in sorted(point_dir.iterdir()):
        if TEMP_NAME.fullmatch(path.name) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
            log.warning("%s: removed %s, left by an interrupted execution", point_dir, path.name)
    return removed


def recorded(job: Job, accept_failed: bool) -> PointResult | None:
    """The outcome a point's markers record, as skipped: done (notebook and done.json), or
    failed (failed.json) when ``accept_failed`` or when the failure was recorded after the sweep
    planned the point (``job["failed_seen"]``, the marker's mtime then: another sweep executed
    the point meanwhile, and running it again would execute it twice); None: execute it."""
    point_dir = Path(job["point_dir"])
    failed = point_dir / FAILED
    status: Literal["done", "failed"]
    if is_done(job):
        path, status = point_dir / DONE, "done"
    elif failed.exists() and (accept_failed or _news(job, failed)):
        path, status = failed, "failed"
    else:
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # written atomically, so only by hand: keep the status
        marker = {}
    keys = ("seconds", "cell", "exec_count", "error")
    # the marker's JSON, as _run_point wrote it
    result = cast(PointResult, {k: marker[k] for k in keys if k in marker})
    # "finished": the local-time field of markers written before finished_at existed
    result.update(
        {
            "status": status,
            "skipped": True,
            "finished_at": marker.get("finished_at", marker.get("finished")),
        }
    )
    return result


def _news(job: Job, failed: Path) -> bool:
    """failed.json was written after the sweep planned the job (a job planned without looking
    has no news)."""
    return "failed_seen" in job and mtime_ns(failed) != job["failed_seen"]


def _holder(point_dir: Path) -> str:
    """Who holds a point's lock, from the owner file ``FolderLock`` writes beside it."""
    try:
        owner = json.loads((point_dir / f"{LOCK_NAME}.owner").read_text(encoding="utf-8"))
        return f"PID {owner['pid']} on {owner['host']} (since {owner['started']})"
    except (OSError, ValueError, KeyError, TypeError):  # it is still writing it, or gone
        return "another process"


def _error_cell(notebook: Path, fallback: int) -> int:
    """Index of the failing cell in the saved notebook, the one users open. papermill's own
    cell_index counts before it inserts an error banner at the top and an anchor cell above the
    failing one, so read the saved file instead."""
    import nbformat

    try:
        cells = nbformat.read(notebook, as_version=4).cells
    except Exception:
        return fallback
    for index, cell in enumerate(cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return index
    return fallback


def mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def is_done(job: Job) -> bool:
    return Path(job["output_notebook"]).exists() and (Path(job["point_dir"]) / DONE).exists()
