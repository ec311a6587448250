"""``ragbench check RUN_DIR --require "rag k=4: contains >= 0.6" [--verdict rag]``: a CI gate
over a finished run (``ragbench.analysis.gate``)."""

from __future__ import annotations

from pathlib import Path

import typer

from ragbench.analysis.gate import check_run
from ragbench.io import cli_error, user_errors

GATE_FAILED_EXIT = 1


def register(app: typer.Typer) -> None:
    """Adds ``ragbench check`` to the root typer app."""

    @app.command(
        "check",
        epilog=f"Exit codes: 0: every requirement holds. {GATE_FAILED_EXIT}: one or more fail "
        "(one FAILED line each), the verdict chose another variant or its model is too weak to "
        "tell, records of the variants it reads failed (beyond --max-errors), "
        "or the run did not finish (stopped at its budget, interrupted, killed). 2: a malformed "
        "requirement, naming it and the valid variants or values, or no run folder.",
    )
    def check_command(
        run_dir: Path = typer.Argument(..., help="a run folder (results.parquet + manifest.json)"),
        require: list[str] = typer.Option(  # noqa: B008 (typer reads defaults at definition)
            [],
            "--require",
            "-r",
            metavar="'VARIANT: VALUE OP NUMBER'",
            help="repeatable: 'rag k=4: contains >= 0.6', 'rag k=4: contains.ci_low >= 0.5', "
            "'long_context: dollars_per_1k <= 0.5' (values: each score, its .ci_low, .ci_high "
            "and .n; dollars_per_1k, latency_seconds, prompt_tokens, completion_tokens)",
        ),
        verdict: str | None = typer.Option(
            None,
            help="the verdict must choose this variant (words of its label: rag, long_context)",
        ),
        metric: str | None = typer.Option(None, help="the verdict's metric (default: the first)"),
        max_errors: int = typer.Option(
            0,
            min=0,
            help="failed records of the variants the gate reads that still let it pass (the "
            "means leave them out)",
        ),
    ) -> None:
        """Fail (exit 1) when a run misses its requirements: a nightly job's gate."""
        if not require and verdict is None:
            raise cli_error(ValueError("nothing to check: give --require and/or --verdict"))
        with user_errors():  # GateError (a ValueError): the requirement and the valid names
            failed = check_run(run_dir, list(require), verdict, metric, max_errors)
        for line in failed:
            typer.echo(line)
        if failed:
            raise typer.Exit(GATE_FAILED_EXIT)
        typer.echo(f"ok: {len(require) + (verdict is not None)} requirement(s) hold in {run_dir}")
