"""Papermill grid sweeps: one notebook execution per parameter point, parallel and resumable.

A sweep YAML names a notebook, fixed parameters and a grid::

    notebook: notebooks/01_niah_heatmap.ipynb
    parameters: {model: smollm2-135m-instruct}
    grid: {context_tokens: [1000, 2000], top_k: [2, 4]}
    output_dir: data/results/sweeps/niah      # optional

Each point runs in its own folder ``<output_dir>/<slug>-<hash>/``: the executed notebook (named
from the point's parameters), the notebook's own outputs (it receives that folder as the parameter
named by ``output_param``, ``output_dir`` by default) and a ``done.json`` marker written atomically
after success. A point counts as done only when both its notebook and its marker exist, so an
interrupted sweep resumes where it stopped. A failing point records its cell and error in
``failed.json`` and never stops the others. The results of the finished points (the parquet files
matched by ``results``) are concatenated with the point's parameters as columns.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ragbench.io import atomic_write_text, dumps_canonical
from ragbench.registry import did_you_mean

DONE, FAILED = "done.json", "failed.json"
EXECUTORS = ("local", "ray")
# papermill's notebook parameter types are only hints; these are the ones we can check cheaply.
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
}


class SweepSpecError(ValueError):
    """A bad sweep file or a parameter the notebook does not declare; names the file and key."""


class SweepSpec(BaseModel):
    """The sweep YAML. Unknown keys are errors, like every config in ragbench."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notebook: str  # the parameterised notebook, relative to the YAML's folder or the cwd
    parameters: dict[str, Any] = {}  # fixed for every point
    grid: dict[str, list[Any]] = {}  # name -> values; the sweep runs their cartesian product
    output_dir: str | None = None  # sweep folder; default data/results/sweeps/<yaml stem>
    output_param: str = "output_dir"  # notebook parameter that receives each point's folder
    # glob, inside a point's folder, of the tables it writes; ragbench.runner writes
    # <output_dir>/<name>-<hash>/results.parquet
    results: str = "**/results.parquet"
    kernel: str = "python3"  # "python3" resolves to the interpreter running the sweep

    @field_validator("grid")
    @classmethod
    def _grid_values(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in grid.items():
            if not values:
                raise ValueError(f"grid.{name}: needs at least one value")
            keys = [dumps_canonical(v) for v in values]
            if len(set(keys)) != len(keys):
                raise ValueError(f"grid.{name}: repeated values {values}")
        return grid


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


# --- spec loading and grid expansion (pure) -------------------------------------------------------


def load_spec(path: str | os.PathLike) -> SweepSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepSpecError(f"{path}: no such sweep file") from None
    except yaml.YAMLError as exc:
        raise SweepSpecError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SweepSpecError(f"{path}: expected a mapping with 'notebook', 'parameters', 'grid'")
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = f"unknown key; {did_you_mean(str(err['loc'][-1]), SweepSpec.model_fields)}"
            if err["type"] == "value_error":  # our validators already name the key
                problems.append(f"{path}: {msg.removeprefix('Value error, ')}")
            else:
                problems.append(f"{path}: {key}: {msg}")
        raise SweepSpecError("\n".join(problems)) from None


def expand_grid(spec: SweepSpec | dict[str, Any]) -> list[dict[str, Any]]:
    """Fixed parameters merged with each point of the grid, in YAML order (last key fastest)."""
    if not isinstance(spec, SweepSpec):
        spec = SweepSpec.model_validate(spec)
    both = sorted(set(spec.parameters) & set(spec.grid))
    if both:
        raise SweepSpecError(f"parameters and grid both set {both}; keep each name in one place")
    names = list(spec.grid)
    return [
        {**spec.parameters, **dict(zip(names, values, strict=True))}
        for values in itertools.product(*(spec.grid[n] for n in names))
    ]


def point_id(params: dict[str, Any], varying: Sequence[str] | None = None) -> str:
    """A stable, filesystem-safe name: the varying parameters as a slug, plus a hash of all."""
    digest = hashlib.sha256(dumps_canonical(params).encode()).hexdigest()[:8]
    names = list(varying) if varying is not None else sorted(params)
    parts = [f"{n}={_slug_value(params[n])}" for n in names if n in params]
    slug = re.sub(r"[^A-Za-z0-9=.,+_-]+", "-", "_".join(parts)).strip("-")[:80]
    return f"{slug}-{digest}" if slug else digest


def _slug_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def check_parameters(
    notebook: Path, names: Sequence[str], where: str, values: Sequence[tuple[str, Any]] = ()
) -> dict[str, Any]:
    """Fail before any execution on a name the notebook does not declare, or a value whose
    type contradicts a simple declared type (int, float, str, bool); return the declarations."""
    import papermill

    declared = papermill.inspect_notebook(str(notebook))
    if not declared:
        raise SweepSpecError(f"{where}: {notebook} has no cell tagged 'parameters'")
    problems = [
        f"{where}: unknown parameter {n!r} for {notebook.name}; {did_you_mean(n, declared)}"
        for n in names
        if n not in declared
    ]
    for name, value in values:
        expected = _SIMPLE_TYPES.get(str(declared.get(name, {}).get("inferred_type_name")))
        bad_bool = isinstance(value, bool) and expected is not None and bool not in expected
        if expected and (not isinstance(value, expected) or bad_bool):
            problems.append(
                f"{where}: parameter {name!r} is declared "
                f"{declared[name]['inferred_type_name']}, got {value!r}"
            )
    if problems:
        raise SweepSpecError("\n".join(problems))
    return declared


# --- execution ------------------------------------------------------------------------------------


def kernel_config() -> Any:
    """traitlets config for the kernels papermill starts: the kernel manager provisions CurveZMQ
    keys when the kernelspec declares support, so kernel traffic is encrypted: the fix ipykernel
    7.x names in the "Kernel is running over TCP without encryption" warning it logs at every
    start otherwise. Empty with a jupyter_client or pyzmq too old to do it."""
    import zmq
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    if "transport_encryption" not in KernelManager.class_trait_names() or not zmq.has("curve"):
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


def kernel_cli_args() -> list[str]:
    """:func:`kernel_config` as command-line flags for ``jupyter lab`` / ``jupyter server`` (the
    Makefile's ``lab`` target), so JupyterLab's kernels are encrypted too."""
    return [
        f"--{section}.{name}={value}"
        for section, traits in kernel_config().items()
        for name, value in traits.items()
    ]


def execute_notebook(notebook: str | os.PathLike, output: str | os.PathLike, **kwargs: Any) -> Any:
    """``papermill.execute_notebook`` with :func:`kernel_config`; keyword arguments as papermill's
    (parameters, cwd, kernel_name, progress_bar, ...). Returns the executed notebook."""
    import papermill

    return papermill.execute_notebook(str(notebook), str(output), config=kernel_config(), **kwargs)


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
