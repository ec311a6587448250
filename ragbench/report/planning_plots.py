"""Plots of the planning tables (``ragbench.analysis.planning``): KV-cache memory per sequence,
$ per query against questions per document with a prefix cache, and its break-even against RAG.
``ragbench.report`` re-exports them for the notebooks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

import ragbench.report.readable as readable
from ragbench.registry import unknown

_ax = readable.axes


def plot_kv_cache(
    kv: pd.DataFrame, gpu_memory_gib: float | None = None, ax: Axes | None = None
) -> Axes:
    """KV-cache GiB per sequence against context length per model (``planning.kv_cache_table``),
    log-log, with one GPU's memory as a dashed line."""
    ax = _ax(ax, figsize=(8, 4))
    for i, (name, group) in enumerate(kv.groupby("model", sort=False)):
        ax.loglog(group["context_tokens"], group["kv_gib"], label=name, **readable.series_style(i))
    values = list(kv["kv_gib"])
    if gpu_memory_gib:
        ax.axhline(
            gpu_memory_gib, color="k", ls="--", lw=1, label=f"GPU memory ({gpu_memory_gib:g} GiB)"
        )
        values.append(gpu_memory_gib)
    readable.count_axis_at(ax.xaxis, kv["context_tokens"].unique().tolist())
    readable.log_axis(ax.yaxis, values)
    ax.set(xlabel="context length (tokens)", ylabel="KV cache per sequence (GiB)")
    ax.set_title("KV-cache memory")
    readable.legend_beside(ax)  # beside: never on a line
    ax.grid(alpha=0.3, which="both")
    return ax


def plot_break_even(curve: pd.DataFrame, sheet: str | None = None, ax: Axes | None = None) -> Axes:
    """$ per 1,000 queries against questions per document for one price sheet (the first in
    ``curve`` by default): each RAG variant (dashed, flat: RAG pays full price every question)
    and long context with and without a prefix cache (``planning.prefix_cache_break_even``).
    Where the prefix-cache curve crosses a RAG line is that variant's break-even. A prefix
    shorter than the sheet's minimum cacheable prompt is never cached: both long-context curves
    then coincide, and the legend says so."""
    ax = _ax(ax, figsize=(8, 4))
    sheets = list(dict.fromkeys(curve["sheet"]))
    if not sheets:
        raise ValueError("empty break-even curve: the run has no successful long_context/rag rows")
    sheet = sheet or sheets[0]
    if sheet not in sheets:
        raise unknown("sheet", sheet, sheets)
    rows = curve[curve["sheet"] == sheet]
    drawn: dict[tuple[float, ...], str] = {}
    for i, (series, part) in enumerate(rows.groupby("series", sort=False)):
        rag = not str(series).startswith("long context")
        y = tuple(part["dollars_per_query"] * 1000)
        label = str(series)
        if y in drawn:  # a curve exactly under another one: say so, or it looks missing
            label += f" (= {drawn[y]})"
        drawn.setdefault(y, str(series))
        style = readable.series_style(i)
        ax.semilogx(
            part["questions_per_document"],
            y,
            label=label,
            ls="--" if rag else "-",
            marker=None if rag else style["marker"],
            ms=style["ms"] - 3,
            lw=1 if rag else 1.8,
        )
    readable.log_axis(ax.xaxis, list(rows["questions_per_document"]))  # counts: 1, 10, 100
    ax.set(
        xlabel="questions per document",
        ylabel="$ per 1,000 queries",
        title=f"Break-even with prefix caching ({sheet})",
    )
    ax.set_ylim(bottom=0)
    readable.legend_beside(ax)
    ax.grid(alpha=0.3)
    return ax


def plot_prefix_caching(
    caching: pd.DataFrame, rag_dollars: float | None = None, ax: Axes | None = None
) -> Axes:
    """$ per 1,000 questions against questions per document, long context with and without a
    prefix cache (``planning.prefix_caching_table``), and RAG's cost as a dashed line;
    ``rag_dollars`` is RAG's $ per question."""
    ax = _ax(ax, figsize=(8, 4))
    q = caching["questions_per_document"]
    for i, (column, label) in enumerate(
        [
            ("dollars_per_question_no_cache", "long context, no cache"),
            ("dollars_per_question_prefix_cache", "long context, prefix cache"),
        ]
    ):
        ax.semilogx(q, caching[column] * 1000, label=label, **readable.series_style(i))
    if rag_dollars is not None:
        ax.axhline(rag_dollars * 1000, color="k", ls="--", lw=1, label="RAG")
    readable.count_axis_at(ax.xaxis, q.unique().tolist())  # counts: 1, 10, 100 rather than 10^k
    ax.set(xlabel="questions per document", ylabel="$ per 1,000 questions", title="Prefix caching")
    ax.set_ylim(bottom=0)
    readable.legend_beside(ax)  # beside: never on a curve
    ax.grid(alpha=0.3)
    return ax
