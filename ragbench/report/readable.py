"""Figures and tables a reader can take in without the author: axis names with units, tick
labels that never run together, series that stay visible when they tie, tables in fixed
notation with units.

``report`` builds on these; ``figure_problems`` is the check the tests run over every figure
(tick labels overlapping on an axis, a legend covering data).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox
    from pandas.io.formats.style import Styler

from ragbench.metrics.answer import METRICS
from ragbench.retrieval.metrics import is_metric as is_retrieval_metric

_Format = Callable[[object], str]


class SeriesStyle(TypedDict):
    """A series' marker, marker size and line width (``series_style``)."""

    marker: str
    ms: int
    lw: NotRequired[float]  # the oracle's star has no line


# readable names for the columns figures and tables show; metric names map through
# ``metric_label`` (rates: shown as percentages)
_METRIC_NAMES = {
    "string_match_all": "needle found (string match)",
    "string_match_part": "any answer found (string match)",
    "exact_match": "exact match",
    "f1": "token F1",
    "contains": "answer contained",
    "gold_hit": "gold chunk retrieved",
}


def axes(ax: Axes | None = None, figsize: tuple[float, float] = (6, 4)) -> Axes:
    """``ax``, or a new axes with constrained layout (labels never cut at the figure's edge)."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def metric_label(metric: str, what: str = "mean") -> str:
    """``string_match_all`` -> ``needle found (string match), % of queries``: the axis name a
    reader understands, with the unit (metrics are rates in [0, 1], shown as percentages)."""
    name = _METRIC_NAMES.get(metric)
    if name is None:
        name = metric.replace("_", " ")
    suffix = "% of queries" if what == "mean" else what
    return f"{name}, {suffix}"


def percent_axis(axis: Axis) -> None:
    """Show a [0, 1] rate axis as 0%..100% (tables show rates as percentages too)."""
    from matplotlib.ticker import MultipleLocator, PercentFormatter

    axis.set_major_locator(MultipleLocator(0.25))
    axis.set_major_formatter(PercentFormatter(1.0, decimals=0))


def compact_number(value: float) -> str:
    """1024 -> ``1k``, 131072 -> ``128k``, 7000 -> ``7k``, 0.02 -> ``0.02``, 2e-05 -> ``0.00002``: fixed
    notation, short enough for a tick label (never ``2x10^-2``)."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1024 and magnitude % 1024 == 0 and magnitude < 2**30:
        return f"{value / 1024:g}k"  # token counts: 8192 reads 8k, as context windows are named
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e3:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 1:
        return f"{value:.3g}"
    # three significant digits, fixed notation, trailing zeros dropped: a locator's ticks on a
    # short range (0.125, 0.175) keep their third digit (two read 0.12 and 0.17)
    digits = -math.floor(math.log10(magnitude)) + 2
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def log_axis(axis: Axis, values: Sequence[float]) -> None:
    """A log axis whose labels never run together: a few even ticks within half a decade, ticks
    at 1-2-5 steps when the data spans under two decades, powers of ten otherwise, labelled in fixed notation; no minor labels
    (matplotlib labels minor ticks on short ranges, ``2x10^3 3x10^3 ...``, which collide)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    positive = [v for v in values if v and v > 0 and math.isfinite(v)]
    span = math.log10(max(positive) / min(positive)) if positive else 0.0
    if span < 1.6:
        subs: tuple[float, ...] = (1.0, 2.0, 5.0)
    elif span < 3:
        subs = (1.0, 3.0)
    else:
        subs = (1.0,)
    if span < 0.5:  # within half a decade LogLocator finds < 2 ticks and falls back to dense
        # linear ones (0.005, 0.0055, 0.006, ... collide): a few evenly spaced ticks instead
        axis.set_major_locator(MaxNLocator(nbins=4, min_n_ticks=2))
    else:
        axis.set_major_locator(LogLocator(subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda v, _: compact_number(v)))
    axis.set_minor_formatter(NullFormatter())


def count_axis_at(axis: Axis, values: Sequence[float]) -> None:
    """Ticks exactly at the tested values (context lengths, questions per document), labelled
    compactly (``1k 8k 32k 131k``): the reader sees what was measured."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ticks = sorted({float(v) for v in values})
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: compact_number(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


# ------------------------------------------------------------------------ tied series

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def series_style(i: int) -> SeriesStyle:
    """Series ``i``'s marker and size: each later series drawn smaller with another marker, so
    a series exactly under another still shows around it."""
    return {"marker": MARKERS[i % len(MARKERS)], "ms": max(10 - 2 * (i % 4), 4), "lw": 1.6}


def coincide_labels(series: Mapping[str, tuple[object, ...]]) -> dict[str, str]:
    """Legend labels saying when a series coincides with an earlier one: ``rag k=3 (= long
    context)``; ``series`` maps each label to its points (hashable), in drawing order."""
    seen: dict[tuple[object, ...], str] = {}
    labels = {}
    for label, points in series.items():
        labels[label] = f"{label} (= {seen[points]})" if points in seen else label
        seen.setdefault(points, label)
    return labels


def legend_beside(ax: Axes, **kwargs: object) -> Legend | None:
    """The legend to the right of the axes: never on a line, marker or bar."""
    if not ax.get_legend_handles_labels()[0]:
        return None
    return ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1), **kwargs)


# ------------------------------------------------------------------------ the check


def _visible_labels(axis: Axis) -> list[Text]:
    low, high = sorted(axis.get_view_interval())
    span = (high - low) or 1.0
    out = []
    for locs, labels in (
        (axis.get_majorticklocs(), axis.get_majorticklabels()),
        (axis.get_minorticklocs(), axis.get_minorticklabels()),
    ):
        for loc, label in zip(locs, labels, strict=False):
            inside = low - 1e-9 * span <= loc <= high + 1e-9 * span
            if inside and label.get_visible() and label.get_text().strip():
                out.append(label)
    return out


def _overlap(a: Bbox, b: Bbox, pad: float = 0.5) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > pad and min(a.y1, b.y1) - max(a.y0, b.y0) > pad


def _data_points(ax: Axes) -> list[tuple[float, float]]:
    """Display coordinates of what the axes draws: line vertices (and points along each
    segment, so a legend across a line counts), scatter offsets and bar corners."""
    import numpy as np

    points: list[tuple[float, float]] = []
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        if len(xy) == 0:
            continue
        if len(xy) == 2 and line.get_transform() is not ax.transData:  # axhline / axvline
            display = line.get_transform().transform(xy)
        else:
            display = ax.transData.transform(xy)
        for (x0, y0), (x1, y1) in zip(display[:-1], display[1:], strict=True):
            for t in np.linspace(0, 1, 25):
                points.append((x0 + t * (x1 - x0), y0 + t * (y1 - y0)))
        points.extend(map(tuple, display))
    for collection in ax.collections:
        offsets = np.asarray(collection.get_offsets())
        if len(offsets):
            points.extend(map(tuple, collection.get_offset_transform().transform(offsets)))
    for patch in ax.patches:
        box = patch.get_window_extent()
        if box.width > 0.5 and box.height > 0.5:
            points.extend([(box.x0, box.y0), (box.x1, box.y1), ((box.x0 + box.x1) / 2, box.y0)])
            points.extend([((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)])
    return [p for p in points if all(math.isfinite(v) for v in p)]


def figure_problems(fig: Figure) -> list[str]:
    """What a reader could not read in ``fig``: tick labels of one axis that overlap, and a
    legend that covers a plotted point, line or bar. Empty when the figure is readable."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg and its kin
    problems = []
    for i, ax in enumerate(fig.axes):
        name = ax.get_title() or ax.get_ylabel() or f"axes {i}"
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = _visible_labels(axis)
            boxes = [label.get_window_extent(renderer) for label in labels]
            for a in range(len(boxes)):
                for b in range(a + 1, len(boxes)):
                    if _overlap(boxes[a], boxes[b]):
                        problems.append(
                            f"{name!r}: {which} tick labels {labels[a].get_text()!r} and "
                            f"{labels[b].get_text()!r} overlap"
                        )
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            box = legend.get_window_extent(renderer)
            inside = ax.get_window_extent(renderer)
            if _overlap(box, inside, pad=0):
                for x, y in _data_points(ax):
                    if box.x0 < x < box.x1 and box.y0 < y < box.y1 and inside.contains(x, y):
                        problems.append(f"{name!r}: the legend covers data at ({x:.0f}, {y:.0f})")
                        break
    return problems


# ------------------------------------------------------------------------ tables

_RATE_WORDS = ("rate", "share", "saving", "recall", "accuracy", "ci_low", "ci_high", "gold_hit")


# columns where an infinite or missing value means the thing never happens (a break-even point
# that is never reached): they read "never", not "inf"
_NEVER_WORDS = ("break_even", "cheaper_from")


def reads_never(column: Hashable) -> bool:
    """Whether ``column``'s infinite or missing values mean "never" (``_NEVER_WORDS``)."""
    return any(word in str(column).lower() for word in _NEVER_WORDS)


def _kind(column: Hashable, values: pd.Series, rates: Sequence[str]) -> str:
    """How a column reads: ``dollars`` (per query), ``dollars_total``, ``dollars_1k`` (already per
    1k), ``rate``, ``int``, ``float`` or ``other``."""
    import pandas as pd

    name = str(column).lower()
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        return "other"
    if "$/1k" in name or "per_1k" in name or "dollars_1k" in name:
        return "dollars_1k"
    if "dollars" in name and "total" in name:
        return "dollars_total"
    if "dollars" in name or name.startswith("$"):
        return "dollars"
    finite = values[values.abs() != math.inf].dropna()
    metric = name in METRICS or name.startswith(("judge_", "semantic"))
    metric = metric or is_retrieval_metric(name)  # mrr@10, ndcg: shares, like their CIs
    shares = finite.empty or finite.between(-1, 1).all()
    if (column in rates or metric or any(word in name for word in _RATE_WORDS)) and shares:
        return "rate"
    if name in ("n", "n_missing", "records", "errors") or name.endswith(("tokens", "_n")):
        return "int"
    if not finite.empty and (finite == finite.round()).all() and finite.abs().max() < 1e15:
        return "int"
    return "float"


def per_1k(dollars_per_query: float) -> str:
    """Dollars per query as ``$`` per 1,000 queries in fixed notation (``$0.0741``); NaN: ``–``."""
    if dollars_per_query != dollars_per_query:
        return "–"
    return f"${dollars_per_query * 1000:,.4f}"


def _dollars(total: float) -> str:
    return f"${total:,.6f}" if abs(total) < 1 else f"${total:,.2f}"


def _float(value: float) -> str:
    return f"{value:,.3g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _finite(fmt: Callable[[float], str], never: bool) -> _Format:
    """``fmt`` for finite values; an infinite one reads "never" (``never``) or as ``∞``."""

    def show(value: object) -> str:
        if isinstance(value, float) and math.isinf(value):
            return "never" if never and value > 0 else ("∞" if value > 0 else "-∞")
        return fmt(cast(float, value))  # a numeric column's value

    return show


def _formats(
    table: pd.DataFrame, rates: Sequence[str]
) -> tuple[dict[Hashable, _Format], dict[Hashable, str]]:
    """Per column: how its values print and the header with its unit (see ``readable_table``)."""
    formats: dict[Hashable, _Format] = {}
    headers: dict[Hashable, str] = {}
    for column in table.columns:
        kind = _kind(column, table[column], rates)
        fmt: Callable[[float], str] | None = None
        if kind == "dollars":
            fmt = per_1k
            headers[column] = f"{column} ($ / 1k queries)"
        elif kind == "dollars_total":
            fmt = _dollars
            headers[column] = f"{column} ($)"
        elif kind == "dollars_1k":
            fmt = "${:,.4f}".format
        elif kind == "rate":
            fmt = "{:.1%}".format
        elif kind == "int":
            fmt = "{:,.0f}".format
        elif kind == "float":
            fmt = _float
        if fmt is not None:
            formats[column] = _finite(fmt, reads_never(column))
    return formats, headers


def readable_table(
    table: pd.DataFrame, rates: Sequence[str] = (), styler: Styler | None = None
) -> Styler:
    """``table`` formatted for reading, as a pandas ``Styler`` (the numbers stay numbers in
    ``.data``): dollars per query as ``$`` per 1,000 queries in fixed notation, dollar totals in
    fixed notation, rates (metric means, CIs, shares, savings, and the columns named in
    ``rates``) as percentages, integers and token counts as integers with thousands separators,
    other numbers to 3 significant digits; missing values as ``–``, and where a column counts
    until something happens (a break-even point) an infinite or missing value as ``never``.
    Column headers get the unit (``dollars`` -> ``$ / 1k queries``). ``styler``: format this
    ``Styler`` of ``table`` instead of a new one."""
    formats, headers = _formats(table, rates)
    styler = (table.style if styler is None else styler).format(
        {c: f for c, f in formats.items()}, na_rep="–"
    )
    never: list[Hashable] = [c for c in table.columns if reads_never(c) and c in formats]
    if never:
        # subset: a dict alone would reset every other column's format
        styler = styler.format({c: formats[c] for c in never}, subset=never, na_rep="never")
    if headers:
        styler = styler.format_index(lambda c: headers.get(c, str(c)), axis=1)
    return styler


def readable_text(table: pd.DataFrame, rates: Sequence[str] = ()) -> str:
    """``readable_table`` as aligned plain text, for terminals (``ragbench run --dry-run``)."""
    shown, headers = shown_values(table, rates)
    return shown.rename(columns=headers).to_string(index=False)


def shown_values(
    table: pd.DataFrame, rates: Sequence[str] = ()
) -> tuple[pd.DataFrame, dict[Hashable, str]]:
    """``table`` with every value as the text ``readable_table`` shows, and the headers with
    units (``{column: header}`` where a unit was added)."""
    formats, headers = _formats(table, rates)
    shown = table.astype(object).copy()
    for column in table.columns:
        missing = "never" if reads_never(column) else "–"
        fmt = formats.get(column, str)
        shown[column] = [missing if _missing(v) else fmt(v) for v in table[column]]
    return shown.astype(str) if len(shown.columns) else shown, headers


def _missing(value: float | str | None) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_scalar(value) and pd.isna(value))
