"""``ragbench run CONFIG``: run an experiment config and print accuracy and cost per variant."""

from __future__ import annotations

from pathlib import Path

import typer

from ragbench import secrets
from ragbench.analysis._common import error_summary
from ragbench.analysis.verdict import sequential_look
from ragbench.experiment.budget import BUDGET_EXIT, EXIT_HELP
from ragbench.experiment.config.run import RunConfig, load_config, with_origin
from ragbench.experiment.dry_run import dry_run
from ragbench.experiment.preflight import OverWindowError
from ragbench.experiment.runner import run
from ragbench.io import ALL_FAILED_EXIT, EXIT_CODES_HELP, cli_error, sigterm_exits, user_errors
from ragbench.locks import LockHeldError
from ragbench.report import summary
from ragbench.report.readable import readable_text
from ragbench.report.tables import table_remarks
from ragbench.strategies.retrieve_only import RetrieveOnlyParams, metric_names
from ragbench.workspace import tracking

# what a command stopped by SIGTERM says (ragbench.io.sigterm_exits): the same command resumes
RESUME = "the records written are kept; run the same command again to resume"


def register(app: typer.Typer) -> None:
    """Adds ``ragbench run CONFIG`` to the root typer app."""

    @app.command("run", epilog=f"{EXIT_CODES_HELP}\n\n{EXIT_HELP}")
    def run_command(
        config: Path = typer.Argument(..., help="experiment YAML, e.g. configs/quick-cpu.yaml"),
        output_dir: str | None = typer.Option(None, help="override the config's output_dir"),
        quiet: bool = typer.Option(False, help="no progress bar"),
        wait: bool = typer.Option(False, help="if another process is writing the run, wait"),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="count tokens and dollars per strategy; load no model"
        ),
        set_: list[str] = typer.Option(  # noqa: B008 (typer reads defaults at definition)
            [],
            "--set",
            metavar="PATH=VALUE",
            help="override a config value (repeatable), YAML-parsed and validated like the "
            "file: --set model.max_new_tokens=64 --set strategies[1].params.top_k=[2,4]",
        ),
        limit: int | None = typer.Option(
            None, min=1, help="only the first N examples (dataset.limit)"
        ),
        threads: int | None = typer.Option(
            None, min=1, help="torch CPU threads (model.threads); 1-2 on a busy machine"
        ),
        executor: str = typer.Option(
            "local",
            help="where generation runs: local (this process) | ray (--workers Ray "
            "workers, each its own model; RAY_ADDRESS joins a running cluster)",
        ),
        workers: int = typer.Option(1, min=1, help="Ray workers (--executor ray)"),
        max_dollars: float | None = typer.Option(
            None,
            help="stop before the run's spend passes this many dollars (max_dollars; exit "
            f"{BUDGET_EXIT}); a dry run refuses a config estimated over it (exit 2)",
        ),
        mlflow: bool = typer.Option(
            False,
            "--mlflow",
            help="log the run to MLflow (default store ./mlruns; the "
            "config's tracking.mlflow section, if any, says where)",
        ),
        mlflow_uri: str | None = typer.Option(
            None, metavar="URI", help="MLflow tracking URI or folder (implies --mlflow)"
        ),
        mlflow_experiment: str | None = typer.Option(
            None, help="MLflow experiment (implies --mlflow; default: ragbench)"
        ),
        until_decided: bool = typer.Option(
            False,
            "--until-decided",
            help="questions in a seeded random order, in rounds, until a group-sequential test "
            "decides (the config's sequential section; default: 5 rounds, O'Brien-Fleming)",
        ),
    ) -> None:
        """Run an experiment config (resumable): results.parquet + manifest.json.

        Overrides (--set, --limit, --threads) are recorded in the manifest. Long-context prompts
        over the model's window under the overflow policy error stop it before the model loads
        (exit 2), naming how many, the longest and the valid policies."""
        # ConfigError, DatasetError: ValueErrors naming file, line, field; OverWindowError: the
        # long-context prompts over the window, found before the model loads (exit 2, as both)
        with user_errors(LockHeldError, OverWindowError, tracking.TrackingError):
            overrides = list(set_)
            overrides += [f"dataset.limit={limit}"] if limit else []
            overrides += [f"model.threads={threads}"] if threads else []
            overrides += [f"max_dollars={max_dollars:.12f}"] if max_dollars is not None else []
            cfg = _config(config, overrides, until_decided, output_dir)
            if dry_run:
                _echo_dry_run(cfg, progress=not quiet)
                return
            tracked = tracking.settings(cfg, mlflow, mlflow_uri, mlflow_experiment)
            if tracked is not None:
                tracking.check(tracked)  # before the run, not after it
            with sigterm_exits(resume=RESUME):
                df = run(
                    cfg,
                    progress=not quiet,
                    wait=wait,
                    executor=executor,
                    workers=workers,
                    until_decided=sequential_look,
                )
        _echo_outcome(cfg, df, tracked)


def _config(
    config: Path, overrides: list[str], until_decided: bool, output_dir: str | None
) -> RunConfig:
    """The config file with the command line's overrides; ``--until-decided`` without a
    ``sequential`` section takes the section's defaults; ``--output-dir`` is a command-line
    path, against the working directory."""
    cfg = load_config(config, overrides)
    if until_decided and cfg.sequential is None:
        cfg = load_config(cfg, ["sequential={}"])
    if output_dir:
        cfg = with_origin(cfg.model_copy(update={"output_dir": output_dir}), output_base=None)
    return cfg


def _echo_outcome(cfg: RunConfig, df, tracked: tracking.Tracking | None) -> None:
    """What ``ragbench run`` prints after the run: its folder, where a sequential run stopped,
    the MLflow run, the summaries and errors; exits non-zero for a budget stop or an all-failed
    run."""
    typer.echo(f"run folder: {df.attrs['run_dir']}")
    if df.attrs.get("sequential"):  # where it stopped, and the verdict at that look
        typer.echo(df.attrs["sequential"]["line"])
        if df.attrs["sequential"].get("verdict"):
            typer.echo(f"verdict: {df.attrs['sequential']['verdict']}")
    if tracked is not None:
        log_to_mlflow(df.attrs["run_dir"], tracked)
    if df.attrs.get("stopped"):  # max_dollars (the runner logged its one line); rerun resumes
        raise typer.Exit(code=BUDGET_EXIT)
    if df.attrs.get("failed"):  # every record failed: one line, the most common error
        raise cli_error(ValueError(failed_line(df)), code=ALL_FAILED_EXIT)
    failed = int(df["error"].notna().sum())
    _echo_summaries(cfg, df)
    if failed:
        _echo_errors(df, f"{failed} of {len(df)} records failed (rerun to retry them)")
    if df.attrs.get("unjudged"):  # the judge's calls failed for some (the runner logged it)
        typer.echo(df.attrs["unjudged"])
    if df.attrs.get("over_budget"):  # past max_dollars anyway (the runner logged by how much)
        raise typer.Exit(code=BUDGET_EXIT)


def log_to_mlflow(run_dir: str, tracked: tracking.Tracking) -> None:
    """Log a finished run to MLflow; a store that refuses is one error line (exit 1): the run
    itself is saved, and a rerun with --mlflow logs it."""
    try:
        run_id = tracking.log_run(run_dir, tracked)
    except tracking.TrackingError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(
        f"mlflow: run {run_id} in {secrets.redact_text(tracked.uri)} "
        f"(experiment {tracked.experiment})"
    )


def _echo_summaries(cfg: RunConfig, df) -> None:
    """Per metric shown, the score with its 95% CI and the mean cost per query (``$ per 1k
    queries``, rates as %: as notebooks show them), each table's remarks under it
    (``warning: ...``, ``note: ...``); a remark about the records rather than the metric (empty
    answers) comes with every table, and is said once."""
    said: set[str] = set()
    for metric in shown_metrics(cfg, df):
        table = summary(df, metric=metric, seed=cfg.seed)
        typer.echo(readable_text(table))
        for remark in table_remarks(table):
            if remark not in said:
                typer.echo(remark)
            said.add(remark)


def failed_line(df) -> str:
    """What ``ragbench run`` and ``compare`` print when every record failed (the manifest says
    ``failed``): the runner's line, naming the most common error, and where to look."""
    return f"{df.attrs['failed']} (each in {df.attrs['run_dir']}/records.jsonl; rerun to retry)"


def _echo_errors(df, headline: str) -> None:
    """``headline``, then the most frequent errors with their counts (already redacted)."""
    typer.echo(f"{headline}; most frequent errors:")
    for message, count in error_summary(df["error"]):
        typer.echo(f"  {count:5d} x {message}")


def echo_estimate(table) -> None:
    """A dry run's table (``experiment.dry_run``), its total bound in dollars and its notes: what
    ``run --dry-run`` and ``compare``'s estimate print."""
    typer.echo(readable_text(table))
    total = table["dollars_total_max"].sum(min_count=1)
    if total == total:  # not NaN
        typer.echo(f"total: at most ${total:,.6f} for {int(table['records'].sum())} records")
    for note in table.attrs["notes"]:
        typer.echo(f"note: {note}")


def _echo_dry_run(cfg: RunConfig, progress: bool) -> None:
    table = dry_run(cfg, progress=progress)
    typer.echo(f"dry run of {cfg.name}: nothing generated, nothing written")
    echo_estimate(table)
    if table.attrs.get("over_budget"):  # the estimate is over max_dollars: exit 2
        raise cli_error(ValueError(f"dry run of {cfg.name}: {table.attrs['over_budget']}"))


def shown_metrics(cfg: RunConfig, df) -> list[str]:
    """The config's answer metrics that scored something; with none (a run that generates no
    answer: retrieve_only), the retrieval metrics its points computed at their own top_k."""
    scored = [m for m in cfg.metrics if m in df and df[m].notna().any()]
    if scored:
        return scored
    # the points that generate nothing: retrieve_only's
    ranked = [p for p in cfg.points if isinstance(p, RetrieveOnlyParams)]
    names = dict.fromkeys(
        n for p in ranked for n in metric_names(p.top_k) if n.endswith(f"@{p.top_k}")
    )
    return [n for n in names if n in df and df[n].notna().any()]
