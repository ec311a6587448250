"""The summary table: accuracy with a bootstrap CI and mean cost per query, one row per
strategy variant; its Pareto front; and RULER's effective context length."""

from __future__ import annotations

import warnings
from typing import Any

from ragbench.analysis.labels import with_labels
from ragbench.analysis.self_route import self_route_warnings
from ragbench.judge.agreement import judge_warnings
from ragbench.metrics.answer import aggregate

# the per-query cost columns a summary table averages (the oracle's rows too), in display
# order; measured KV-cache bytes when the transformers backend measured them. The amortised_*
# columns add each query's share of a one-time cost (a preloaded corpus; equal to dollars /
# resource_seconds where there is none)
SUMMARY_COST_COLUMNS = (
    "prompt_tokens", "dollars", "amortised_dollars", "resource_seconds",
    "amortised_resource_seconds", "latency_seconds", "kv_bytes_measured", "flops",
)  # fmt: skip


def summary(df: Any, metric: str = "string_match_all", seed: int = 0) -> Any:
    """Accuracy with a bootstrap 95% CI and mean cost per query, one row per strategy variant.

    Cost columns are means over the variant's successful rows: prompt tokens, $/query (when a
    price sheet was set), latency seconds, and estimated FLOPs. ``attrs["warnings"]`` lists what
    the numbers hide (a Self-Route that never routed equals RAG; a judge metric's low agreement
    with exact match, or an embedded judge); each is also raised as a
    ``UserWarning`` so a notebook shows it next to the table.
    """
    import pandas as pd

    df = with_labels(df)
    acc = aggregate(df, ["label"], metric, seed=seed).set_index("label")
    ok = df[df["error"].isna()] if "error" in df else df
    cost_cols = [c for c in SUMMARY_COST_COLUMNS if c in ok]
    costs = ok.groupby("label")[cost_cols].mean(numeric_only=True) if cost_cols else None
    table = acc[["mean", "ci_low", "ci_high", "n", "n_missing"]].rename(columns={"mean": metric})
    if costs is not None:
        table = table.join(costs)
    order = pd.Index(df.drop_duplicates("label")["label"])  # first-seen order = config order
    out = table.reindex(order).reset_index()
    out.attrs["warnings"] = self_route_warnings(df, metric)
    if metric.startswith("judge_"):  # how far the judge can be trusted, next to its numbers
        out.attrs["warnings"] += judge_warnings(df)
    for message in out.attrs["warnings"]:
        warnings.warn(message, UserWarning, stacklevel=2)
    return out


def pareto_front(table: Any, cost: str, metric: str) -> Any:
    """Rows not dominated by a cheaper-or-equal, at-least-as-accurate row (lower cost, higher
    metric is better), sorted by cost."""
    rows = table.dropna(subset=[cost, metric]).sort_values([cost, metric], ascending=[True, False])
    best = float("-inf")
    keep = []
    for idx, value in zip(rows.index, rows[metric], strict=True):
        if value > best:
            keep.append(idx)
            best = value
    return rows.loc[keep]


def effective_context_length(
    df: Any,
    metric: str = "string_match_all",
    threshold: float = 0.85,
    length: str = "context_length",
) -> Any:
    """RULER-style effective length per strategy variant: the longest tested length such that the
    mean score at it and at every shorter length stays at or above ``threshold`` (NaN if none)."""
    import pandas as pd

    df = with_labels(df)
    means = df.groupby(["label", length])[metric].mean().reset_index().sort_values(length)
    rows = []
    for label, group in means.groupby("label", sort=False):
        effective = float("nan")
        for n, score in zip(group[length], group[metric], strict=True):
            if score < threshold:
                break
            effective = n
        rows.append({"label": label, "effective_length": effective, "threshold": threshold})
    return pd.DataFrame(rows)
