"""``ragbench view RUN_DIR... [--out FILE]``: the per-question page of one or several runs
(``ragbench.report.explore``): every question with every variant's answer beside it, filters,
search, and the retrieved chunks and long-context cuts behind each answer."""

from __future__ import annotations

from pathlib import Path

import typer

from ragbench.io import user_errors
from ragbench.report.explore import write_view


def register(app: typer.Typer) -> None:
    """Adds ``ragbench view`` to the root typer app."""

    @app.command(
        "view", epilog="Exit codes: 0: the page is written. 2: a path that is not a run folder."
    )
    def view_command(
        run_dirs: list[Path] = typer.Argument(..., help="one or more run folders"),
        out: Path | None = typer.Option(
            None,
            "--out",
            "-o",
            help="the HTML file (default: RUN_DIR/view.html for one run, ./view.html for several)",
        ),
        metric: str | None = typer.Option(
            None, help="the metric rows are right or wrong on (default: the run's first)"
        ),
        title: str = typer.Option("", help="the page's heading"),
    ) -> None:
        """Write one self-contained HTML page: a row per question, every variant beside it."""
        target = out or (run_dirs[0] / "view.html" if len(run_dirs) == 1 else Path("view.html"))
        with user_errors():  # not a run folder, an unknown metric
            written = write_view(run_dirs, target, metric=metric, title=title)
        typer.echo(f"wrote {written}")
