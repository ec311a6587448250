"""The `ragbench` command. Each area registers its sub-commands from its own module; heavy
libraries (torch, faiss, transformers, pandas, papermill) load only inside the commands, so
`ragbench --help` is fast."""

from __future__ import annotations

from importlib import import_module

import typer

from ragbench.assets import describe
from ragbench.experiment.budget import EXIT_HELP as BUDGET_EXIT_HELP
from ragbench.io import EXIT_CODES_HELP
from ragbench.secrets import install_log_redaction

app = typer.Typer(
    help="ragbench: retrieval (RAG) vs long-context prompting, accuracy and cost per query.",
    epilog=f"{EXIT_CODES_HELP}\n\n{BUDGET_EXIT_HELP}",  # the exit codes (ragbench.io, budget)
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# modules exposing `register(app: typer.Typer) -> None`
COMMAND_MODULES: list[str] = [
    "ragbench.cli.data",
    "ragbench.cli.retrieval",
    "ragbench.cli.run",
    "ragbench.cli.compare",
    "ragbench.cli.sweep",
    "ragbench.cli.cost",
    "ragbench.cli.listing",
    "ragbench.cli.check",
    "ragbench.cli.export",
    "ragbench.cli.view",
    "ragbench.cli.diff",
]


@app.callback()
def _setup() -> None:
    """Log warnings to stderr with credentials masked (``ragbench.secrets``)."""
    install_log_redaction()


@app.command()
def assets() -> None:
    """Show where each embedded offline asset is (or how to install it)."""
    for name, where in describe().items():
        typer.echo(f"{name:24s} {where}")


for _module in COMMAND_MODULES:
    import_module(_module).register(app)
