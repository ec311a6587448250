"""Papermill grid sweeps: one notebook execution per parameter point, parallel and resumable.

The sweep YAML (notebook, fixed parameters, grid) is read and expanded by ``sweep/spec.py``;
one point's lock, execution and markers are ``sweep/point.py``; kernels are started encrypted
by ``kernels.py``. Each point runs in its own folder
``<output_dir>/<slug>-<hash>/``: the executed notebook (named from the point's parameters), the
notebook's own outputs (it receives that folder as the parameter named by ``output_param``,
``output_dir`` by default) and a ``done.json`` marker written atomically after success. A point
counts as done only when both its notebook and its marker exist, so an interrupted sweep resumes
where it stopped. A failing point records its cell and error in ``failed.json`` and never stops
the others. The results of the finished points (the parquet files matched by ``results``) are
concatenated with the point's parameters as columns.

Resumed points keep their first completion: ``done.json`` records when the point finished and
how long it took, and a later sweep reports that status, duration and time with ``skipped`` set
(it did not execute the point itself), in its outcome and in ``summary.json``.

One writer per point. A point's folder is locked (``locks.FolderLock``) while it executes, so two
sweeps of one spec (started twice by mistake, or on purpose to share the work) execute each point
once. A sweep that finds a point locked by a live process passes it by and runs the others first;
then, by default (``wait=True``, ``ragbench sweep --wait``), it waits for those points and
reports the outcome the other process recorded, as skipped: each sweep ends with every point's
result and the full results table, as if it had run alone. With ``wait=False`` (``--no-wait``)
such a point is reported as ``held`` (running elsewhere, with the holder's PID and host), is not
counted as failed, and is picked up by a later resume. The lock of a process that died is taken
over (the OS releases it), and a point it left without a marker runs again, once the temporary
files of the saves it cut short are removed from the point's folder (logged).

Stopping a sweep stops its work: on SIGTERM or SIGINT (Ctrl-C) the local executor's workers and
every kernel they started are ended before the sweep exits (``kernels.reap_children_on_signals``),
and a worker whose sweep dies (even by SIGKILL) ends itself and its kernel (``kernels.init_worker``).
An interrupted point writes no marker: it is neither done nor failed, and runs on resume; the
points finished before the stop are in ``summary.json`` and ``results.parquet`` already.

Credentials never reach disk: parameter values in ``summary.json``, the markers, the results
table's parameter columns and printed point ids go through ``secrets.redact``; error texts
through ``secrets.redact_text``; executed notebooks are redacted as papermill saves them, and
the kernels keep no IPython history (``kernels.HISTORY_OFF``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ragbench import secrets
from ragbench.io import atomic_write_bytes, atomic_write_text, dumps_canonical
from ragbench.registry import did_you_mean
from ragbench.schema import check_folder
from ragbench.workspace.kernels import (
    KernelNotInstalledError,
    init_worker,
    reap_children_on_signals,
    resolve_kernel,
)
from ragbench.workspace.sweep.point import (
    FAILED,
    Job,
    PointResult,
    execute_point,
    is_done,
    mtime_ns,
    recorded,
)
from ragbench.workspace.sweep.spec import (
    SweepSpec,
    SweepSpecError,
    check_parameters,
    expand_grid,
    load_spec,
    point_id,
    spec_places,
)

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

EXECUTORS = ("local", "ray")


@dataclass
class PointOutcome:
    """What happened to one point: done, failed, or held (another live process is executing it
    and this sweep did not wait). ``skipped``: this sweep did not execute the point; ``status``,
    ``seconds`` and ``finished_at`` are those of the execution that did (an earlier sweep, or
    another one running at the same time). ``params`` have their credentials masked."""

    point_id: str
    params: dict[str, object]
    status: Literal["done", "failed", "held"]
    notebook: str
    seconds: float = 0.0  # execution time of the notebook
    finished_at: str | None = None  # ISO 8601 UTC, when the execution ended
    skipped: bool = False
    cell: int | None = None  # index of the failing cell in the executed notebook
    exec_count: int | None = None  # its execution count, the "In [n]" Jupyter shows
    error: str | None = None  # "ValueError: message"
    holder: str | None = None  # held: "PID 123 on host (since ...)"

    def where(self) -> str:
        count = f" (In [{self.exec_count}])" if self.exec_count is not None else ""
        return f"cell {self.cell}{count}" if self.cell is not None else ""

    def note(self) -> str:
        """The error, or for a held point who holds it."""
        if self.status == "held":
            return f"running elsewhere: {self.holder or 'another process'}"
        if self.error:
            return f"{self.where()}: {self.error}" if self.cell is not None else self.error
        return ""

    def describe(self) -> str:
        skipped = ", skipped" if self.skipped else ""
        note = self.note()
        return f"{self.point_id}: {self.status}{skipped}" + (f" ({note})" if note else "")


@dataclass
class SweepOutcome:
    sweep_dir: Path
    points: list[PointOutcome] = field(default_factory=list)
    results: Any = None  # pandas.DataFrame; typed loosely so this module imports no pandas

    def count(self, status: str, skipped: bool | None = None) -> int:
        """Points with this status; ``skipped`` True/False: only those (not) executed now."""
        return sum(
            p.status == status and (skipped is None or p.skipped == skipped) for p in self.points
        )

    @property
    def failed(self) -> list[PointOutcome]:
        return [p for p in self.points if p.status == "failed"]

    @property
    def held(self) -> list[PointOutcome]:
        return [p for p in self.points if p.status == "held"]


# --- the sweep ------------------------------------------------------------------------------------


def _plan(spec: SweepSpec, spec_path: Path, sweep_dir: Path) -> list[Job]:
    notebook = _resolve(spec.notebook, spec_path.parent)
    points = expand_grid(spec)
    names = list(dict.fromkeys([*spec.parameters, *spec.grid]))
    values = [*spec.parameters.items(), *((n, v) for n in spec.grid for v in spec.grid[n])]
    places = spec_places(spec, spec_path)
    declared = check_parameters(notebook, names, str(spec_path), values, places)
    try:  # a missing kernel fails the sweep once, before any point, not every point
        kernel = resolve_kernel(notebook, spec.kernel)
    except KernelNotInstalledError as exc:
        raise SweepSpecError(f"{spec_path}: {exc}") from None
    inject_output = spec.output_param in declared
    varying = [n for n in spec.grid if len(spec.grid[n]) > 1] or list(spec.grid)
    jobs: list[Job] = []
    for params in points:
        pid = point_id(params, varying)
        point_dir = sweep_dir / pid
        parameters = dict(params)
        if inject_output and spec.output_param not in params:
            parameters[spec.output_param] = str(point_dir.resolve())
        jobs.append(
            {
                "point_id": pid,
                "params": secrets.redact(params),  # what is stored and shown
                "parameters": parameters,  # what the notebook gets, credentials included
                "notebook": str(notebook),
                "point_dir": str(point_dir),
                "output_notebook": str(point_dir / f"{notebook.stem}__{pid}.ipynb"),
                "kernel": kernel,
                "cwd": str(notebook.parent),
            }
        )
    return jobs


def _resolve(path: str, base: Path) -> Path:
    for candidate in (base / path, Path(path)):
        if candidate.exists():
            return candidate.resolve()
    raise SweepSpecError(f"notebook {path!r} not found (looked in {base} and {Path.cwd()})")


def execute_sweep(
    spec_path: str | os.PathLike,
    workers: int = 1,
    executor: str = "local",
    rerun_failed: bool = True,
    on_point: Callable[[PointOutcome], None] | None = None,
    wait: bool = True,
    on_plan: Callable[[int], None] | None = None,
) -> SweepOutcome:
    """Run every point not already done; return each point's outcome and the results table.

    ``on_plan(points)``: called once the spec has checked out, before any point runs (a
    progress bar starts there, so a spec error is not printed under an empty one).

    ``wait``: for points another live process is executing, wait and report its outcome (True),
    or report them ``held`` and move on (False); see the module docstring."""
    if executor not in EXECUTORS:
        raise SweepSpecError(f"unknown executor {executor!r}; {did_you_mean(executor, EXECUTORS)}")
    spec_path = Path(spec_path)
    spec = load_spec(spec_path)
    sweep_dir = Path(spec.output_dir or Path("data/results/sweeps") / spec_path.stem)
    jobs = _plan(spec, spec_path, sweep_dir)  # raises on unknown parameters before running
    if on_plan is not None:
        on_plan(len(jobs))
    outcome = SweepOutcome(sweep_dir=sweep_dir)

    def report(job: Job, result: PointResult) -> None:
        point = PointOutcome(
            point_id=job["point_id"],
            params=job["params"],
            status=result["status"],
            notebook=job["output_notebook"],
            seconds=result.get("seconds") or 0.0,
            finished_at=result.get("finished_at"),
            skipped=bool(result.get("skipped", False)),
            cell=result.get("cell"),
            exec_count=result.get("exec_count"),
            error=result.get("error"),
            holder=result.get("holder"),
        )
        outcome.points.append(point)
        if on_point:
            on_point(point)

    # A cheap first look, so a finished sweep starts no pool; the worker looks again under the
    # point's lock, which is what makes "executed once" hold against a concurrent sweep.
    todo: list[Job] = []
    for job in jobs:
        earlier = recorded(job, accept_failed=not rerun_failed)
        if earlier:
            report(job, earlier)
        else:
            failed_seen = mtime_ns(Path(job["point_dir"]) / FAILED)  # a later one is news
            todo.append(
                {
                    **job,
                    "wait": False,
                    "accept_failed": not rerun_failed,
                    "failed_seen": failed_seen,
                }
            )

    held: list[Job] = []

    def first_pass(job: Job, result: PointResult) -> None:
        if result["status"] == "held" and wait:
            held.append(job)
        else:
            report(job, result)

    run = _run_ray if executor == "ray" else _run_local
    try:
        run(todo, max(1, workers), first_pass)
        if held:
            log.warning(
                "%d point(s) are being executed by another process; waiting for them: %s",
                len(held),
                ", ".join(job["point_id"] for job in held),
            )
            # whatever the other process records is the point's outcome (a failure it records
            # is not retried: see sweep_point.recorded); if it died without a marker, it runs here
            run([{**job, "wait": True} for job in held], max(1, workers), report)
    except BaseException:
        # stopped (SIGTERM, Ctrl-C) or broken: the points finished so far are in summary.json
        # and results.parquet, as a reader checking an overnight sweep expects
        _write_summary(outcome, jobs, spec.results, sweep_dir)
        log.warning(
            "sweep stopped: %d of %d point(s) recorded in %s",
            len(outcome.points),
            len(jobs),
            sweep_dir / "summary.json",
        )
        raise
    _write_summary(outcome, jobs, spec.results, sweep_dir)
    return outcome


def _write_summary(outcome: SweepOutcome, jobs: list[Job], pattern: str, sweep_dir: Path) -> None:
    """The points reported so far, in plan order, to ``summary.json``, and the finished points'
    results to ``results.parquet`` (both atomic)."""
    order = {job["point_id"]: i for i, job in enumerate(jobs)}
    outcome.points.sort(key=lambda p: order[p.point_id])
    outcome.results = collect_results(jobs, pattern)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        sweep_dir / "summary.json",
        json.dumps([asdict(p) for p in outcome.points], indent=2, default=str) + "\n",
    )
    if len(outcome.results):
        atomic_write_bytes(sweep_dir / "results.parquet", outcome.results.to_parquet(index=False))


def _run_local(jobs: list[Job], workers: int, report: Callable) -> None:
    if not jobs:
        return
    with reap_children_on_signals():  # a stopped sweep leaves no worker or kernel behind
        if workers == 1 or len(jobs) <= 1:  # no pool: simpler tracebacks, no process start cost
            for job in jobs:
                report(job, execute_point(job))
            return
        import multiprocessing

        # spawn, not fork: papermill's zmq/asyncio state must not be copied into children.
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            max_workers=min(workers, len(jobs)),
            mp_context=ctx,
            initializer=init_worker,
            initargs=(os.getpid(),),
        )
        try:
            futures = {pool.submit(execute_point, job): job for job in jobs}
            for future in as_completed(futures):
                report(futures[future], future.result())
        except BaseException:
            # interrupted (the signal handler has ended the workers already) or a broken pool:
            # do not wait for work that will not come
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _run_ray(jobs: list[Job], workers: int, report: Callable) -> None:
    """Each point as a Ray task. RAY_ADDRESS set: join that cluster (paths must be shared)."""
    if not jobs:
        return
    try:
        import ray
    except ImportError:
        raise SweepSpecError("--executor ray needs Ray: pip install 'ray>=2.9'") from None
    started_here = not ray.is_initialized()
    if started_here:
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(execute_point)
        pending = {task.remote(job): job for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                report(pending.pop(ref), ray.get(ref))
    finally:
        if started_here:
            ray.shutdown()


# --- results --------------------------------------------------------------------------------------


def collect_results(jobs: list[Job], pattern: str = "**/results.parquet") -> pd.DataFrame:
    """Concatenate the tables of the done points, adding each point's parameters as columns
    (credentials masked: ``job["params"]`` is redacted)."""
    import pandas as pd

    frames = []
    for job in jobs:
        if not is_done(job):
            continue
        for path in sorted(Path(job["point_dir"]).glob(pattern)):
            check_folder(path.parent)  # another schema's run folder: SchemaError
            frame = pd.read_parquet(path)
            for name, value in secrets.redact(job["params"]).items():
                column = name if name not in frame.columns else f"param.{name}"
                scalar = isinstance(value, (str, int, float, bool)) or value is None
                frame[column] = value if scalar else dumps_canonical(value)
            frame["point_id"] = job["point_id"]
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
