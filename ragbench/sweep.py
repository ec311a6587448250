"""Papermill grid sweeps: one notebook execution per parameter point, parallel and resumable.

The sweep YAML (notebook, fixed parameters, grid) is read and expanded by ``sweep_spec.py``;
kernels are started encrypted by ``kernels.py``. Each point runs in its own folder
``<output_dir>/<slug>-<hash>/``: the executed notebook (named from the point's parameters), the
notebook's own outputs (it receives that folder as the parameter named by ``output_param``,
``output_dir`` by default) and a ``done.json`` marker written atomically after success. A point
counts as done only when both its notebook and its marker exist, so an interrupted sweep resumes
where it stopped. A failing point records its cell and error in ``failed.json`` and never stops
the others. The results of the finished points (the parquet files matched by ``results``) are
concatenated with the point's parameters as columns.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ragbench.io import atomic_write_text, dumps_canonical
from ragbench.kernels import execute_notebook
from ragbench.registry import did_you_mean
from ragbench.sweep_spec import (
    SweepSpec,
    SweepSpecError,
    check_parameters,
    expand_grid,
    load_spec,
    point_id,
)

DONE, FAILED = "done.json", "failed.json"
EXECUTORS = ("local", "ray")


@dataclass
class PointOutcome:
    """What happened to one point: done (ran now), skipped (done before) or failed."""

    point_id: str
    params: dict[str, Any]
    status: Literal["done", "skipped", "failed"]
    notebook: str
    seconds: float = 0.0
    cell: int | None = None  # index of the failing cell in the executed notebook
    exec_count: int | None = None  # its execution count, the "In [n]" Jupyter shows
    error: str | None = None  # "ValueError: message"

    def where(self) -> str:
        count = f" (In [{self.exec_count}])" if self.exec_count is not None else ""
        return f"cell {self.cell}{count}" if self.cell is not None else ""

    def describe(self) -> str:
        where = f"{self.where()}: " if self.cell is not None else ""
        return f"{self.point_id}: {self.status}" + (f" ({where}{self.error})" if self.error else "")


@dataclass
class SweepOutcome:
    sweep_dir: Path
    points: list[PointOutcome] = field(default_factory=list)
    results: Any = None  # pandas.DataFrame; typed loosely so this module imports no pandas

    def count(self, status: str) -> int:
        return sum(p.status == status for p in self.points)

    @property
    def failed(self) -> list[PointOutcome]:
        return [p for p in self.points if p.status == "failed"]


def _execute_point(job: dict[str, Any]) -> dict[str, Any]:
    """Run one point with papermill (in a worker process or Ray task); never raises."""
    from papermill.exceptions import PapermillExecutionError

    point_dir, out_nb = Path(job["point_dir"]), Path(job["output_notebook"])
    point_dir.mkdir(parents=True, exist_ok=True)
    for marker in (DONE, FAILED):
        (point_dir / marker).unlink(missing_ok=True)
    start = time.perf_counter()
    result: dict[str, Any] = {"status": "done", "cell": None, "exec_count": None, "error": None}
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
            status="failed",
            cell=_error_cell(out_nb, exc.cell_index),
            exec_count=exc.exec_count,
            error=f"{exc.ename}: {exc.evalue}",
        )
    except Exception as exc:  # kernel died, missing kernel, ...: still only this point fails
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        result["traceback"] = traceback.format_exc()
    result["seconds"] = round(time.perf_counter() - start, 3)
    marker = {"point_id": job["point_id"], "params": job["params"], "notebook": out_nb.name}
    marker.update(result, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    name = DONE if result["status"] == "done" else FAILED
    atomic_write_text(point_dir / name, json.dumps(marker, indent=2, default=str) + "\n")
    return result


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


def _plan(spec: SweepSpec, spec_path: Path, sweep_dir: Path) -> list[dict[str, Any]]:
    notebook = _resolve(spec.notebook, spec_path.parent)
    points = expand_grid(spec)
    names = list(dict.fromkeys([*spec.parameters, *spec.grid]))
    values = [*spec.parameters.items(), *((n, v) for n in spec.grid for v in spec.grid[n])]
    declared = check_parameters(notebook, names, str(spec_path), values)
    inject_output = spec.output_param in declared
    varying = [n for n in spec.grid if len(spec.grid[n]) > 1] or list(spec.grid)
    jobs = []
    for params in points:
        pid = point_id(params, varying)
        point_dir = sweep_dir / pid
        parameters = dict(params)
        if inject_output and spec.output_param not in params:
            parameters[spec.output_param] = str(point_dir.resolve())
        jobs.append(
            {
                "point_id": pid,
                "params": params,
                "parameters": parameters,
                "notebook": str(notebook),
                "point_dir": str(point_dir),
                "output_notebook": str(point_dir / f"{notebook.stem}__{pid}.ipynb"),
                "kernel": spec.kernel,
                "cwd": str(notebook.parent),
            }
        )
    return jobs


def _resolve(path: str, base: Path) -> Path:
    for candidate in (base / path, Path(path)):
        if candidate.exists():
            return candidate.resolve()
    raise SweepSpecError(f"notebook {path!r} not found (looked in {base} and {Path.cwd()})")


def _is_done(job: dict[str, Any]) -> bool:
    return Path(job["output_notebook"]).exists() and (Path(job["point_dir"]) / DONE).exists()


def execute_sweep(
    spec_path: str | os.PathLike,
    workers: int = 1,
    executor: str = "local",
    rerun_failed: bool = True,
    on_point: Callable[[PointOutcome], None] | None = None,
) -> SweepOutcome:
    """Run every point not already done; return each point's outcome and the results table."""
    if executor not in EXECUTORS:
        raise SweepSpecError(f"unknown executor {executor!r}; {did_you_mean(executor, EXECUTORS)}")
    spec_path = Path(spec_path)
    spec = load_spec(spec_path)
    sweep_dir = Path(spec.output_dir or Path("data/results/sweeps") / spec_path.stem)
    jobs = _plan(spec, spec_path, sweep_dir)  # raises on unknown parameters before running
    outcome = SweepOutcome(sweep_dir=sweep_dir)

    def report(job: dict[str, Any], result: dict[str, Any]) -> None:
        point = PointOutcome(
            point_id=job["point_id"],
            params=job["params"],
            status=result["status"],
            notebook=job["output_notebook"],
            seconds=result.get("seconds", 0.0),
            cell=result.get("cell"),
            exec_count=result.get("exec_count"),
            error=result.get("error"),
        )
        outcome.points.append(point)
        if on_point:
            on_point(point)

    todo = []
    for job in jobs:
        failed_marker = Path(job["point_dir"]) / FAILED
        if _is_done(job):
            report(job, {"status": "skipped"})
        elif failed_marker.exists() and not rerun_failed:
            report(job, json.loads(failed_marker.read_text(encoding="utf-8")))
        else:
            todo.append(job)

    run = _run_ray if executor == "ray" else _run_local
    run(todo, max(1, workers), report)
    outcome.points.sort(key=lambda p: [j["point_id"] for j in jobs].index(p.point_id))
    outcome.results = collect_results(jobs, spec.results)
    atomic_write_text(
        sweep_dir / "summary.json",
        json.dumps([asdict(p) for p in outcome.points], indent=2, default=str) + "\n",
    )
    if len(outcome.results):
        from ragbench.io import atomic_write_bytes

        atomic_write_bytes(sweep_dir / "results.parquet", outcome.results.to_parquet(index=False))
    return outcome


def run_sweep(
    spec_path: str | os.PathLike,
    workers: int = 1,
    executor: str = "local",
    rerun_failed: bool = True,
) -> Any:
    """Run a sweep and return the results table of all finished points (a pandas DataFrame).

    Failed points are reported as warnings; use :func:`execute_sweep` for per-point outcomes.
    """
    import warnings

    outcome = execute_sweep(spec_path, workers, executor, rerun_failed)
    for point in outcome.failed:
        warnings.warn(f"sweep point failed: {point.describe()}", stacklevel=2)
    return outcome.results


def _run_local(jobs: list[dict[str, Any]], workers: int, report: Callable) -> None:
    if workers == 1 or len(jobs) <= 1:  # no pool: simpler tracebacks, no process start cost
        for job in jobs:
            report(job, _execute_point(job))
        return
    import multiprocessing

    # spawn, not fork: papermill's zmq/asyncio state must not be copied into children.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        futures = {pool.submit(_execute_point, job): job for job in jobs}
        for future in as_completed(futures):
            report(futures[future], future.result())


def _run_ray(jobs: list[dict[str, Any]], workers: int, report: Callable) -> None:
    """Each point as a Ray task. RAY_ADDRESS set: join that cluster (paths must be shared)."""
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
        task = ray.remote(num_cpus=1, max_retries=0)(_execute_point)
        pending = {task.remote(job): job for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                report(pending.pop(ref), ray.get(ref))
    finally:
        if started_here:
            ray.shutdown()


# --- results --------------------------------------------------------------------------------------


def collect_results(jobs: list[dict[str, Any]], pattern: str = "**/results.parquet") -> Any:
    """Concatenate the tables of the done points, adding each point's parameters as columns."""
    import pandas as pd

    frames = []
    for job in jobs:
        if not _is_done(job):
            continue
        for path in sorted(Path(job["point_dir"]).glob(pattern)):
            frame = pd.read_parquet(path)
            for name, value in job["params"].items():
                column = name if name not in frame.columns else f"param.{name}"
                scalar = isinstance(value, (str, int, float, bool)) or value is None
                frame[column] = value if scalar else dumps_canonical(value)
            frame["point_id"] = job["point_id"]
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
