"""Plots for notebooks: every view is computed from the results table (one row per example x
strategy x parameter point, as written by ``ragbench.experiment.runner``) or from a table
``ragbench.analysis`` made of it (the summary, a comparison, failure attribution).

Plot functions take an optional matplotlib ``ax`` and return it (or the figure they made), with
labelled axes, units and legends, so a notebook cell is one call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

import ragbench.report.readable as readable
from ragbench.analysis import (
    CAUSES,
    ORACLE_LABEL,
    attribution_table,
    pareto_front,
    with_labels,
)
from ragbench.analysis._common import resolve_metric
from ragbench.registry import unknown

# ---------------------------------------------------------------------------------- plots


_ax = readable.axes


_COST_UNITS = {
    "dollars": "$ per 1,000 queries",
    "latency_seconds": "latency per query (s)",
    "resource_seconds": "device seconds per query",
    "amortised_dollars": "$ per 1,000 queries, one-time cost amortised",
    "amortised_resource_seconds": "device seconds per query, one-time cost amortised",
    "prompt_tokens": "prompt tokens per query",
    "flops": "FLOPs per query",
    "kv_bytes_measured": "KV-cache MiB per query (measured)",
}
# dollars per query are fractions of a cent: plotted per 1,000 queries, in fixed notation
_COST_SCALE = {
    "dollars": 1000.0,
    "amortised_dollars": 1000.0,
    "kv_bytes_measured": 1 / 2**20,
}  # $ per 1k queries; MiB


def plot_accuracy_vs_cost(
    table: pd.DataFrame, metric: str | None = None, cost: str = "dollars", ax: Axes | None = None
) -> Axes:
    """Scatter of accuracy (with CI bars) against mean cost per query; the Pareto front is drawn.
    ``table``: ``summary``'s (or ``router_headroom``'s); ``metric`` defaults to the one it holds.
    An ``oracle router`` row (``analysis.router_headroom``) is drawn as a star and left out of
    the front: no real router reaches it, it marks the headroom. Variants at the same point are
    drawn with different markers and sizes, and the legend says which coincide."""
    metric = resolve_metric(table, metric)
    ax = _ax(ax, figsize=(8, 4))
    scale = _COST_SCALE.get(cost, 1.0)
    oracle = table["label"] == ORACLE_LABEL
    points = {
        str(row["label"]): (round(row[cost] * scale, 12), round(row[metric], 12))
        for _, row in table.iterrows()
    }
    labels = readable.coincide_labels(points)
    for i, (_, row) in enumerate(table.iterrows()):
        yerr = [[row[metric] - row["ci_low"]], [row["ci_high"] - row[metric]]]
        style = readable.series_style(i)
        if row["label"] == ORACLE_LABEL:
            style = {"marker": "*", "ms": 14}
        ax.errorbar(
            row[cost] * scale,
            row[metric],
            yerr=yerr,
            fmt=style["marker"],
            ms=style["ms"],
            capsize=3,
            label=labels[str(row["label"])],
            alpha=0.85,
        )
    front = pareto_front(table[~oracle], cost, metric)
    if len(front) > 1:
        ax.plot(front[cost] * scale, front[metric], "k--", lw=1, label="Pareto front")
    if cost in ("flops", "dollars") and (table[cost] > 0).all():
        ax.set_xscale("log")
        readable.log_axis(ax.xaxis, list(table[cost] * scale))
    ax.set_xlabel(_COST_UNITS.get(cost, cost))
    ax.set_ylabel(readable.metric_label(metric) + " (95% CI)")
    ax.set_ylim(-0.05, 1.05)
    readable.percent_axis(ax.yaxis)
    memory = cost.startswith("kv_")
    ax.set_title(f"Accuracy vs {'KV-cache memory' if memory else 'cost'} per query")
    readable.legend_beside(ax)
    ax.grid(alpha=0.3)
    return ax


# the table is left untyped: pandas-stubs types its rows' cells as any scalar (no arithmetic)
def plot_compare(table: Any, ax: Axes | None = None) -> Axes:
    """Paired differences from ``compare`` (one row per pair): the mean difference a - b with
    its CI; significant pairs (after adjustment) filled, the others hollow; 0 marked."""
    from matplotlib.ticker import PercentFormatter

    metric = table.attrs.get("metric", "metric")
    level = table.attrs.get("level", 0.05) / table.attrs.get("comparisons", 1)  # Bonferroni
    ax = _ax(ax, figsize=(9, 0.7 * len(table) + 1.5))
    ys = list(range(len(table)))[::-1]  # the first pair on top
    for y, row in zip(ys, table.itertuples(index=False), strict=True):
        err = [[row.diff - row.ci_low], [row.ci_high - row.diff]]
        face = "C3" if row.significant else "white"
        ax.errorbar(
            row.diff,
            y,
            xerr=err,
            fmt="o",
            color="C3" if row.significant else "C0",
            mfc=face,
            capsize=3,
        )
    ax.axvline(0, color="k", lw=1, ls="--")
    # two lines per pair: variant labels are long ("rag k=4 embedder=hash chunk=128 ...")
    ax.set_yticks(ys, [f"{row.a}\nminus {row.b}" for row in table.itertuples(index=False)])
    ax.tick_params(axis="y", labelsize=8)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    name = readable.metric_label(metric, what="").rstrip(", ")
    ax.set_xlabel(
        f"difference in {name} (a - b, percentage points), {100 * (1 - level):.4g}% paired CI"
    )
    ax.set_title("Paired comparison (filled: significant)")
    ax.grid(alpha=0.3, axis="x")
    return ax


_CAUSE_COLORS = {
    "retrieval_miss": "C0",
    "truncated": "C1",
    "distractor_answer": "C3",
    "context_truncated": "C5",
    "reader_miss": "C2",
    "no_context": "C7",
    "unattributed": "C8",
}


def _lines(ax: Axes, series: Mapping[str, pd.DataFrame], x: str, y: str) -> None:
    """One line per labelled group, each with its own marker and size, the legend naming the
    series an identical one hides (``rag k=3 (= long_context)``)."""
    points = {
        label: tuple(zip(g[x].round(12), g[y].round(12), strict=True))
        for label, g in series.items()
    }
    labels = readable.coincide_labels(points)
    for i, (label, group) in enumerate(series.items()):
        ax.plot(group[x], group[y], label=labels[label], alpha=0.85, **readable.series_style(i))


def plot_failure_attribution(records: pd.DataFrame) -> Figure:
    """Where the misses come from (``attribute``'s per-record table): left, each variant's
    share of queries lost to each cause (bar length = miss rate); right, the miss rate against
    the evidence's depth in the context, per variant, where depths are known. Returns the
    figure."""
    import matplotlib.pyplot as plt

    table = attribution_table(records)
    depth_known = records["evidence_depth"].notna().any()
    fig, axes = plt.subplots(
        1,
        2 if depth_known else 1,
        figsize=(13 if depth_known else 8, 0.45 * len(table) + 2.5),
        squeeze=False,
        layout="constrained",
    )
    ax = axes[0][0]
    scored = (table["n"] - table["error"]).clip(lower=1)
    ys = list(range(len(table)))[::-1]
    left = [0.0] * len(table)
    for cause in CAUSES:
        share = (table[cause] / scored).tolist()
        if not any(share):
            continue  # only causes that occurred get a legend entry
        ax.barh(ys, share, left=left, color=_CAUSE_COLORS[cause], label=cause.replace("_", " "))
        left = [a + b for a, b in zip(left, share, strict=True)]
    ax.set_yticks(ys, table["label"].tolist())
    ax.set_xlim(0, 1)
    readable.percent_axis(ax.xaxis)
    ax.set_xlabel("queries answered wrong, by cause (% of queries)")
    ax.set_title("Where the misses come from")
    readable.legend_beside(ax)
    ax.grid(alpha=0.3, axis="x")
    if depth_known:
        ax = axes[0][1]
        ok = records[records["outcome"] != "error"].dropna(subset=["evidence_depth"])
        depth = ok["evidence_depth"]
        # measured depths differ a little from the requested ones (sentence boundaries) and
        # RULER's are all different: round to the nearest 10% so each point pools its queries
        depth = (depth / 10).round() * 10
        rates = ok.assign(miss=~ok["correct"], depth=depth).groupby(["label", "depth"], sort=False)
        series = {
            str(label): group.sort_values("depth")
            for label, group in rates["miss"].mean().reset_index().groupby("label", sort=False)
        }
        _lines(ax, series, "depth", "miss")
        ax.set(
            xlabel="evidence depth in the context (%)",
            ylabel="miss rate (% of queries)",
            ylim=(-0.05, 1.05),
        )
        readable.percent_axis(ax.yaxis)
        ax.set_title("Misses by evidence depth")
        readable.legend_beside(ax)
        ax.grid(alpha=0.3)
    return fig


# axis names with their units for the columns results are usually plotted against
_X_NAMES = {
    "context_length": "context length (tokens)",
    "depth_percent": "needle depth (% of the context)",
    "gold_position": "gold document position (0: first)",
}


def plot_metric_by(
    df: pd.DataFrame,
    x: str,
    metric: str | None = None,
    ax: Axes | None = None,
    xlabel: str | None = None,
) -> Axes:
    """Mean metric against a numeric column (context length, needle depth, gold position...)
    per variant, with a tick at each tested value, labelled compactly (``1k 4k 8k``); tied
    variants stay visible and the legend says which coincide. ``xlabel`` defaults to the
    column's name with its unit where known; ``metric`` the table's first metric column."""
    ax = _ax(ax, figsize=(8, 4))
    df = with_labels(df)
    metric = resolve_metric(df, metric)
    means = df.groupby(["label", x])[metric].mean().reset_index()
    series = {str(k): g.sort_values(x) for k, g in means.groupby("label", sort=False)}
    _lines(ax, series, x, metric)
    readable.count_axis_at(ax.xaxis, means[x].unique().tolist())
    ax.set_xlabel(xlabel or _X_NAMES.get(x, x.replace("_", " ")))
    ax.set_ylabel(readable.metric_label(metric))
    ax.set_ylim(-0.05, 1.05)
    readable.percent_axis(ax.yaxis)
    readable.legend_beside(ax)
    ax.grid(alpha=0.3)
    return ax


def plot_retrieval_tuning(tuning: pd.DataFrame, metric: str | None = None) -> Figure:
    """Recall@k of the gold chunk and downstream accuracy against k, one line per retriever and
    chunk size. ``tuning``: mean ``gold_hit`` and ``metric`` indexed by (retriever, chunk_size,
    top_k), as notebook 03 builds it; ``metric`` defaults to its first metric column. Returns
    the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metric = resolve_metric(tuning, metric)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
    groups = tuning.reset_index().groupby(["retriever", "chunk_size"])
    series = {f"{retriever}, {chunk} tok": g for (retriever, chunk), g in groups}
    _lines(axes[0], series, "top_k", "gold_hit")
    _lines(axes[1], series, "top_k", metric)
    axes[0].set(ylabel="gold chunk retrieved (recall@k, % of queries)", title="Retrieval")
    axes[1].set(ylabel=readable.metric_label(metric), title="Downstream accuracy")
    for ax in axes:
        ax.set(xlabel="k (chunks retrieved)", ylim=(-0.05, 1.05))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # k is a count
        readable.percent_axis(ax.yaxis)
        ax.grid(alpha=0.3)
    readable.legend_beside(axes[1])  # both axes hold the same series: one legend, beside
    return fig


def heatmap_table(
    df: pd.DataFrame,
    label: str,
    metric: str | None = None,
    rows: str = "depth_percent",
    cols: str = "context_length",
) -> pd.DataFrame:
    """Mean metric (default: the table's first metric column) of one strategy variant as a
    rows x cols grid (NIAH: depth x length)."""
    df = with_labels(df)
    metric = resolve_metric(df, metric)
    sub = df[df["label"] == label]
    if sub.empty:
        raise unknown("strategy label", label, df["label"].unique())
    return sub.pivot_table(index=rows, columns=cols, values=metric, aggfunc="mean").sort_index()


def plot_heatmaps(
    df: pd.DataFrame,
    labels: Sequence[str] | None = None,
    metric: str | None = None,
    rows: str = "depth_percent",
    cols: str = "context_length",
) -> Figure:
    """Side-by-side NIAH heatmaps (green = found) for each strategy variant, each cell labelled
    with its value (``100%``; an untested cell stays blank), so an all-found grid still reads as
    numbers and not one green block; returns the figure. ``metric`` defaults to the table's first
    metric column."""
    import matplotlib.pyplot as plt

    df = with_labels(df)
    metric = resolve_metric(df, metric)
    labels = list(labels or df["label"].drop_duplicates())
    fig, axes = plt.subplots(
        1, len(labels), figsize=(4.5 * len(labels), 3.8), squeeze=False, layout="constrained"
    )
    image = None
    grids = []
    for ax, label in zip(axes[0], labels, strict=True):
        grid = heatmap_table(df, label, metric, rows, cols)
        grids.append(grid)
        image = ax.imshow(grid.to_numpy(), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(
            range(grid.shape[1]), [readable.compact_number(cast(float, c)) for c in grid.columns]
        )
        ax.set_yticks(range(grid.shape[0]), _depth_ticks(list(grid.index)))
        ax.set_xlabel("context length (tokens)" if cols == "context_length" else cols)
        ax.set_ylabel("needle depth (%)" if rows == "depth_percent" else rows)
        ax.set_title(label)
    assert image is not None  # one image per label, and subplots needs one at least
    bar = fig.colorbar(image, ax=list(axes[0]), label=readable.metric_label(metric))
    readable.percent_axis(bar.ax.yaxis)
    fig.draw_without_rendering()  # the cells' final size, for the size of their labels
    for ax, grid in zip(axes[0], grids, strict=True):
        _annotate(ax, grid)
    return fig


def _annotate(ax: Axes, grid: Any) -> None:  # pandas-stubs types .iat as any scalar
    """Each cell's value as a percentage, in a size its cell holds: dark text on the light
    middle of the colour map, white on its dark ends."""
    rows, cols = grid.shape
    box = ax.get_window_extent()  # display pixels; points = pixels x 72 / dpi
    width = box.width / max(cols, 1) * 72 / ax.figure.dpi
    height = box.height / max(rows, 1) * 72 / ax.figure.dpi
    # "100%" is about 2.9 x the font size wide: keep it within 80% of the cell, and 60% high
    size = max(4.0, min(10.0, 0.8 * width / 2.9, 0.6 * height))
    for r in range(rows):
        for c in range(cols):
            value = grid.iat[r, c]
            if value != value:  # not tested
                continue
            color = "white" if value < 0.2 or value > 0.85 else "black"
            ax.text(c, r, _cell_text(value), ha="center", va="center", fontsize=size, color=color)


def _cell_text(value: float) -> str:
    """A share as a whole percentage that never rounds a miss away: ``>99%``, not ``100%``."""
    text = f"{value:.0%}"
    if text == "100%" and value < 1:
        return ">99%"
    if text == "0%" and value > 0:
        return "<1%"
    return text


def _depth_ticks(depths: list[float]) -> list[str]:
    """Depth tick labels as the grid asked for them: whole percents (a sigmoid grid's
    15.887 reads ``16``), one decimal only where whole percents would repeat."""
    whole = [f"{d:.0f}" for d in depths]
    return whole if len(set(whole)) == len(whole) else [f"{d:.1f}" for d in depths]
