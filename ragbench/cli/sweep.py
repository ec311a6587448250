"""`ragbench sweep` and `ragbench render`. Heavy libraries (papermill, nbconvert) load only
when a command runs."""

from __future__ import annotations

from pathlib import Path

import typer

from ragbench.io import cli_error, sigterm_exits
from ragbench.workspace import tracking
from ragbench.workspace.render import RenderInputError, render_notebook
from ragbench.workspace.sweep.run import execute_sweep
from ragbench.workspace.sweep.spec import SweepSpecError, load_spec

# what a sweep stopped by SIGTERM says (ragbench.io.sigterm_exits)
RESUME = "the finished points are kept (summary.json); run the same command again for the rest"


def register(app: typer.Typer) -> None:
    app.command()(sweep)
    app.command()(render)


def sweep(
    spec: Path = typer.Argument(..., help="sweep YAML: notebook, parameters, grid, output_dir"),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="points run in parallel"),
    executor: str = typer.Option("local", help="local (process pool) or ray (one task a point)"),
    rerun_failed: bool = typer.Option(True, help="rerun points that failed last time"),
    wait: bool = typer.Option(
        True,
        help="points another running sweep is executing: wait for them and report their result "
        "(--wait), or report them as running elsewhere and finish (--no-wait)",
    ),
    mlflow: bool = typer.Option(
        False, "--mlflow", help="log the sweep to MLflow: a parent run, a child per point's run"
    ),
    mlflow_uri: str | None = typer.Option(
        None,
        metavar="URI",
        help="MLflow tracking URI or folder (implies --mlflow; default ./mlruns)",
    ),
    mlflow_experiment: str | None = typer.Option(
        None, help="MLflow experiment (implies --mlflow; default: ragbench)"
    ),
) -> None:
    """Execute a notebook once per grid point with papermill; done points are skipped.

    Each point is locked while it runs: a second sweep of the same spec shares the work instead
    of repeating it. Ctrl-C or SIGTERM stops the workers and their kernels too."""
    from contextlib import ExitStack

    from tqdm import tqdm

    tracked = tracking.settings(None, mlflow, mlflow_uri, mlflow_experiment)
    # SIGTERM unwinds as in `ragbench run` (the workers and kernels end first: execute_sweep)
    with sigterm_exits(resume=RESUME), ExitStack() as bars:
        bar = None

        def start(points: int) -> None:  # once the spec checks out: no bar above its error
            nonlocal bar
            bar = bars.enter_context(tqdm(total=points, unit="point", desc=spec.stem))

        def advance(point) -> None:
            assert bar is not None  # start() ran: points come after the spec checked out
            bar.update(1)
            bar.set_postfix_str(f"{point.point_id}: {point.status}")

        try:
            if tracked is not None:
                tracking.check(tracked)  # before the sweep, not after it
            outcome = execute_sweep(
                spec, workers, executor, rerun_failed, on_point=advance, wait=wait, on_plan=start
            )
        except (SweepSpecError, tracking.TrackingError) as exc:  # credentials masked already
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    typer.echo(f"\n{'point':48s} {'status':16s} {'seconds':>8s}  {'finished at':25s}  error")
    for p in outcome.points:
        status = f"{p.status} (earlier)" if p.skipped else p.status
        finished = p.finished_at or ""
        typer.echo(
            f"{p.point_id[:48]:48s} {status:16s} {p.seconds:8.1f}  {finished:25s}  {p.note()}"
        )
    held = f", {len(outcome.held)} running elsewhere" if outcome.held else ""
    typer.echo(
        f"\n{outcome.count('done', skipped=False)} done, {outcome.count('done', skipped=True)} "
        f"skipped, {outcome.count('failed')} failed{held}; {len(outcome.results)} result rows in "
        f"{outcome.sweep_dir / 'results.parquet'}"
    )
    for p in outcome.failed:
        typer.echo(f"failed notebook: {p.notebook}")
    if tracked is not None:
        try:
            parent = tracking.log_sweep(outcome, spec, tracked, load_spec(spec).results)
        except tracking.TrackingError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(1) from None
        typer.echo(f"mlflow: sweep run {parent} (experiment {tracked.experiment})")
    if outcome.failed:
        raise typer.Exit(1)


def render(
    notebook: Path = typer.Argument(..., help="executed .ipynb"),
    no_code: bool = typer.Option(False, "--no-code", help="hide code cells (outputs only)"),
    out: Path | None = typer.Option(
        None,
        help="HTML path, or a folder to write <name>[-nocode].html into; default beside the "
        "notebook",
    ),
    manifest: Path | None = typer.Option(None, help="run manifest JSON for the header"),
    allow_unexecuted: bool = typer.Option(
        False,
        "--allow-unexecuted",
        help="render a notebook no cell of which has run, under a 'not executed' banner",
    ),
) -> None:
    """Render an executed notebook to standalone HTML (figures embedded, secrets scrubbed).

    A file that is not an executed notebook is refused with one line on stderr (exit 2)."""
    name = f"{notebook.stem}{'-nocode' if no_code else ''}.html"
    if out is None:  # beside the notebook, wherever it is run from
        out = notebook.with_name(name)
    elif out.is_dir():  # a folder: the page goes into it, under its default name
        out = out / name
    try:
        path = render_notebook(
            notebook,
            out,
            include_code=not no_code,
            manifest=manifest,
            allow_unexecuted=allow_unexecuted,
        )
    except RenderInputError as exc:  # every command's errors read `error: ...` (ragbench.io)
        raise cli_error(exc) from None
    except OSError as exc:  # e.g. the HTML cannot be written (permissions, a file for a folder)
        raise cli_error(ValueError(f"{exc.filename or out}: {exc.strerror or exc}")) from None
    typer.echo(str(path))
