"""``ragbench diff RUN_A RUN_B``: two runs question by question (``report.compare_runs``): the
settings that differ, the matching of their variants, and per pair the paired difference, the
cost and latency ratios and the questions that flipped."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ragbench.io import user_errors
from ragbench.report.explore import write_view
from ragbench.report.run_diff import RunDiff, compare_runs
from ragbench.report.runs import RUN_SEPARATOR, load


def emit(result: RunDiff, as_json: bool, limit: int) -> None:
    """Print the diff: text for people, or the JSON object (``RunDiff.to_json``)."""
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        typer.echo(result.text(limit=limit))


def write_page(run_a: Path, run_b: Path, result: RunDiff, out: Path, metric: str | None) -> Path:
    """The per-question view of both runs (each variant a column, named by its run), starting
    on the first matched pair as A and B."""
    both = load([run_a, run_b])
    a_name, b_name = list(both.attrs["run_dirs"])
    pair = None
    if result.pairs:
        first = result.pairs[0].match
        pair = (
            f"{a_name}{RUN_SEPARATOR}{first.a_label}",
            f"{b_name}{RUN_SEPARATOR}{first.b_label}",
        )
    title = f"ragbench diff: {a_name} vs {b_name}"
    return write_view(both, out, metric=metric, title=title, pair=pair)


def register(app: typer.Typer) -> None:
    """Adds ``ragbench diff`` to the root typer app."""

    @app.command(
        "diff",
        epilog="Exit codes: 0: the diff is shown. 2: one `error: ...` line: a path that is no "
        "run folder, no question in common, an unknown --pair label (naming the valid ones), "
        "a metric one run lacks.",
    )
    def diff_command(
        run_a: Path = typer.Argument(..., help="run folder A (results.parquet + manifest.json)"),
        run_b: Path = typer.Argument(..., help="run folder B, compared with A"),
        pair: list[str] = typer.Option(  # noqa: B008 (typer reads defaults at definition)
            [],
            "--pair",
            metavar="LABEL_A=LABEL_B",
            help="repeatable: pair this variant of A with this one of B ('rag k=4=long_context'); "
            "the others are matched by label, then by strategy and parameters",
        ),
        metric: str | None = typer.Option(None, help="the score to compare (default: A's first)"),
        as_json: bool = typer.Option(
            False, "--json", help='print {"settings", "left_out", "pairs", ...} as JSON'
        ),
        limit: int = typer.Option(10, min=1, help="flipped question ids listed per pair"),
        html: Path | None = typer.Option(
            None, "--html", help="also write the per-question view of both runs to this file"
        ),
    ) -> None:
        """Compare two runs question by question: what differs in their configs, which variant
        of A is which of B, and per pair the paired difference (interval, p), the cost and
        latency ratios and the questions right in one run only."""
        with user_errors():  # RunFolderError, RunDiffError, an unknown label: one line, exit 2
            result = compare_runs(run_a, run_b, pairs=pair or None, metric=metric)
        emit(result, as_json, limit)
        if html is not None:
            with user_errors():
                written = write_page(run_a, run_b, result, html, metric)
            typer.echo(f"wrote {written}", err=as_json)  # --json keeps stdout JSON
