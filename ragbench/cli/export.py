"""``ragbench export RUN_DIR --format jsonl|csv|lm-eval``: a run's per-sample rows (and, for
lm-eval, its aggregate JSON) in files other tools read (``ragbench.workspace.export``)."""

from __future__ import annotations

from pathlib import Path

import typer

from ragbench.io import user_errors
from ragbench.workspace.export import FORMATS, export_run


def register(app: typer.Typer) -> None:
    """Adds ``ragbench export`` to the root typer app."""

    @app.command("export")
    def export_command(
        run_dir: Path = typer.Argument(..., help="a run folder (results.parquet + manifest.json)"),
        format: str = typer.Option(
            "jsonl",
            "--format",
            "-f",
            help=f"{' | '.join(FORMATS)}: per-sample rows, or the "
            "results_<date>.json + samples_<task>_<date>.jsonl lm-evaluation-harness writes",
        ),
        out: Path | None = typer.Option(
            None, help="file (jsonl, csv) or folder (lm-eval); default: RUN_DIR/export/"
        ),
    ) -> None:
        """Export a run's per-sample rows (question, prediction, answers, scores, tokens,
        dollars) as JSONL or CSV, or in lm-evaluation-harness's layout."""
        with user_errors():
            paths = export_run(run_dir, format, out)
        for path in paths:
            typer.echo(str(path))
