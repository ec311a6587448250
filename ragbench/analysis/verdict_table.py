"""The verdict's table (``analysis.verdict``): one row per variant with its score, cost per
query and latency, the reader's constraints checked against it, and the paired cost ratio of
two variants. Kept apart from the decision so each reads in one sitting; ``verdict`` is their
one caller besides ``bad_limit`` (the CLI's option check) and ``cost_ratio`` (``ragbench
diff``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import numpy as np

from ragbench.analysis._common import _scored, own_latency_seconds
from ragbench.analysis.verdict_text import _Fmt, _money

if TYPE_CHECKING:
    import pandas as pd

# cost per query, best first: money (a preloaded corpus's one-time cost amortised), else tokens
COSTS = ("amortised_dollars", "dollars", "prompt_tokens")


def _score_at(table: pd.DataFrame, label: str) -> float:
    """A variant's score in a variant table (``variant_table``: one row per label)."""
    return float(cast("float", table.loc[label, "score"]))


def _machinery_at(table: pd.DataFrame, label: str) -> tuple[str, ...]:
    """What a variant adds over the simplest (``families.annotate``'s ``machinery``)."""
    return cast("tuple[str, ...]", table.loc[label, "machinery"])


def answered_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that answered (error rows apart), scored or not: each was asked and paid for."""
    return df[df["error"].isna()] if "error" in df else df


def variant_table(df: pd.DataFrame, metric: str, cost: str) -> pd.DataFrame:
    """One row per variant (config order): mean score and ``n`` over its scored questions; cost
    per query (x 1000 for dollars) and mean latency over every question it answered (``asked``:
    a question without a gold answer has no score but was asked and paid for), as ``summary``
    counts them."""
    rows = _scored(df, metric)
    g = rows.groupby("label", sort=False)
    out = cast("pd.DataFrame", g[metric].agg(score="mean", n="size"))
    answered = answered_rows(df)
    a = answered.groupby("label", sort=False)
    out["asked"] = a.size().reindex(out.index)
    scale = 1.0 if cost == "prompt_tokens" else 1000.0
    out["cost_per_1k"] = a[cost].mean().reindex(out.index) * scale if cost in rows else np.nan
    latency = own_latency_seconds(answered)  # its own time, the harness's queue apart
    out["latency_s"] = (
        latency.groupby(answered["label"], sort=False).mean().reindex(out.index)
        if latency is not None
        else np.nan
    )
    out["strategy"] = g["strategy"].first() if "strategy" in rows else None
    order = [lb for lb in dict.fromkeys(df["label"]) if lb in out.index]
    return out.reindex(order)


def pick_cost(rows: pd.DataFrame) -> str:
    for name in COSTS:
        if name in rows.columns and len(rows) and rows[name].notna().all():
            return name
    raise ValueError(f"no cost column known for every row; looked for {', '.join(COSTS)}")


def constraint_checks(
    table: pd.DataFrame, metric: str, higher: bool, fmt: _Fmt, limits: dict
) -> dict:
    """{name: (passes per variant, what binds in words, the bound in words)} for the active
    constraints."""
    specs = {  # name: (column, bound is a minimum?, value in words, what, the closest variant)
        "min_accuracy": (
            "score",
            higher,
            fmt.score,
            f"{'minimum' if higher else 'maximum'} {metric}",
            "the most accurate",
        ),
        "max_dollars_per_1k": (
            "cost_per_1k",
            False,
            lambda x: f"{_money(x)} per 1k queries",
            "maximum",
            "the cheapest",
        ),
        "max_latency_s": (
            "latency_s",
            False,
            lambda x: f"{x:.2g} s",
            "maximum latency",
            "the fastest",
        ),
    }
    out = {}
    for name, bound in limits.items():
        if bound is None:
            continue
        column, minimum, show, what, closest = specs[name]
        values = table[column].astype(float)
        if values.isna().all():
            raise ValueError(f"{name} needs a {column} for each variant; the table has none")
        top = values.idxmax() if minimum else values.idxmin()
        out[name] = (
            values >= bound if minimum else values <= bound,
            f"the {what} of {show(bound)} ({closest}, {top}: {show(values[cast('str', top)])})",
            f"the {what} of {show(bound)}",
        )
    return out


def bad_limit(value: float) -> bool:
    """Whether a constraint's value is out of range: a limit is 0 (none) or a positive, finite
    number (NaN, infinity and negatives are not). The one rule for ``verdict`` and the CLI's
    options (``workspace.compare.check_constraints``), checked before a run is paid for."""
    return not (value >= 0 and math.isfinite(value))


def parse_limits(
    min_accuracy: float | None,
    max_dollars_per_1k: float | None,
    max_latency_s: float | None,
    metric: str,
    scores: np.ndarray,
) -> dict[str, float | None]:
    """The constraints as floats (None: no limit), or ValueError naming the one out of range:
    each 0/None (no limit) or a positive number; ``min_accuracy`` at most 1 when ``metric``'s
    scores are shares (0-1), since 60 meant as 60% would ask for 6,000% and every variant
    would fail it. The CLI checks its options by the same rule (``bad_limit``)."""
    given = {
        "min_accuracy": min_accuracy,
        "max_dollars_per_1k": max_dollars_per_1k,
        "max_latency_s": max_latency_s,
    }
    out = {}
    for name, value in given.items():
        value = float(value) if value is not None else 0.0
        if bad_limit(value):
            raise ValueError(f"{name} must be 0 or more (0 or None: no limit); got {value:g}")
        out[name] = value or None
    share = len(scores) and scores.min() >= 0 and scores.max() <= 1
    if share and out["min_accuracy"] and out["min_accuracy"] > 1:
        raise ValueError(
            f"min_accuracy is a mean {metric}, from 0 to 1 here; got "
            f"{out['min_accuracy']:g} (for {out['min_accuracy']:g}%: "
            f"{out['min_accuracy'] / 100:g})"
        )
    return out


def binding_constraints(checks: dict, labels: Iterable[str]) -> tuple[str, ...]:
    """The constraints whose removal alone would let some variant through; when no single one
    does, every constraint some variant fails."""
    names = list(checks)
    alone = [
        n for n in names if any(all(checks[m][0][lb] for m in names if m != n) for lb in labels)
    ]
    return tuple(alone or [n for n in names if not checks[n][0].all()])


def cost_ratio(
    df: pd.DataFrame, cost: str, a: str, b: str, n_boot: int, seed: int
) -> tuple[float, float, float]:
    """(mean cost of ``a`` / mean cost of ``b``, 95% percentile interval) over the questions
    both answered, resampling questions (each keeps its two costs together)."""
    rows = df[df["label"].isin([a, b])]
    if "error" in rows:
        rows = rows[rows["error"].isna()]
    wide = rows.pivot_table(index="example_id", columns="label", values=cost, aggfunc="mean")
    wide = wide.reindex(columns=[a, b]).dropna()
    x, y = wide[a].to_numpy(dtype=float), wide[b].to_numpy(dtype=float)
    if not len(x) or y.sum() <= 0:
        return float("nan"), float("nan"), float("nan")
    ratio = float(x.mean() / y.mean())
    rng = np.random.default_rng([seed, 7])
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    den = y[idx].mean(axis=1)
    boot = x[idx].mean(axis=1)[den > 0] / den[den > 0]
    if not len(boot):
        return ratio, float("nan"), float("nan")
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return ratio, min(float(lo), ratio), max(float(hi), ratio)
