"""``ragbench reprice RUN_DIR --price-sheet NAME`` and ``ragbench prices {list,show,import-genai}``:
price a finished run with another sheet, and see or add price sheets."""

from __future__ import annotations

from pathlib import Path

import typer

from ragbench.cost.prices import available_price_sheets, price_sheet, sheet_yaml
from ragbench.cost.prices_import import import_genai_sheet
from ragbench.cost.reprice import reprice_run
from ragbench.io import atomic_write_text, user_errors
from ragbench.report.readable import per_1k

prices_app = typer.Typer(
    help="Price sheets: list the shipped ones, show one, import one from genai-prices.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Adds ``ragbench reprice`` and the ``ragbench prices`` group to the root app."""
    app.command("reprice")(reprice_command)
    app.add_typer(prices_app, name="prices")


def reprice_command(
    run_dir: Path = typer.Argument(..., help="a run folder (holds results.parquet)"),
    price_sheet: str = typer.Option(..., help="shipped sheet name (ragbench prices list) or YAML"),
    out: Path | None = typer.Option(
        None, help="repriced table path (default RUN_DIR/results.<sheet>.parquet)"
    ),
) -> None:
    """Recompute a run's dollars from its logged tokens and device seconds with another price
    sheet, without calling a model. Writes a new table beside the original (never modified) and
    prints the mean dollars of each strategy variant before and after, in $ per 1,000 queries
    (the unit ``ragbench run`` and the notebooks use)."""
    with user_errors():
        result = reprice_run(run_dir, price_sheet, out)
    table = result.summary
    rows = [("variant", "n", "before ($ / 1k queries)", "after ($ / 1k queries)", "after/before")]
    columns = (
        table.iloc[:, 0],
        table["n"],
        table["dollars_per_query_before"],
        table["dollars_per_query_after"],
        table["after_over_before"],
    )
    for label, n, before, after, ratio in zip(*columns, strict=True):
        rows.append(
            (
                str(label),
                str(n),
                per_1k(before),  # NaN: not priced
                per_1k(after),
                "–" if ratio != ratio else f"{ratio:.2f}x",
            )
        )
    width = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        typer.echo(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, width, strict=True))
            )
        )
    typer.echo(f"table:   {result.table_path}")
    if result.records_path:
        typer.echo(f"records: {result.records_path}")
    typer.echo(f"sheet:   see {result.info_path}")
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)


@prices_app.command("list")
def list_command() -> None:
    """The shipped price sheets: name, kind, date, and the model or hardware they price."""
    for name in available_price_sheets():
        s = price_sheet(name)
        what = f"{s.provider}/{s.model}" if s.model else s.hardware
        typer.echo(f"{name:34s} {s.kind:8s} {s.date:10s} {what}")


@prices_app.command("show")
def show_command(
    name: str = typer.Argument(..., help="shipped sheet name or YAML path"),
) -> None:
    """One sheet's YAML file as shipped (prices, date, source, notes)."""
    with user_errors():
        typer.echo(Path(price_sheet(name).path).read_text(encoding="utf-8"), nl=False)


@prices_app.command("import-genai")
def import_genai_command(
    model: str = typer.Argument(..., help="model name as genai-prices knows it, e.g. gpt-4o"),
    provider: str | None = typer.Option(None, help="provider id, e.g. openai, anthropic, google"),
    out: Path | None = typer.Option(None, help="where to write the sheet (default ./<name>.yaml)"),
) -> None:
    """Write a price sheet from the installed genai-prices package's bundled snapshot (offline;
    `pip install genai-prices`). Check it, and add min_cacheable_prompt_tokens by hand."""
    with user_errors():
        sheet = import_genai_sheet(model, provider)
        path = out or Path(f"{sheet['name']}.yaml")
        if path.exists():
            raise FileExistsError(f"{path}: exists; pass --out to write elsewhere")
        atomic_write_text(path, sheet_yaml(sheet))
    typer.echo(f"wrote {path} (use it as price_sheet: {path})")
