"""Self-Route's diagnostics: how often a router fell back to long context, how accurate each
branch was, and a warning when it never (or always) routed. Router rows are the strategies that
declare ``routes``; a row's ``route`` names the source that answered."""

from __future__ import annotations

from typing import Any

from ragbench.analysis._common import _check_metric, _scored
from ragbench.analysis.labels import with_labels
from ragbench.strategies import FULL_CONTEXT, strategies_where


def _router_rows(df: Any) -> Any:
    """Which rows of ``df`` a router (a strategy that declares ``routes``) wrote."""
    return df["strategy"].isin(strategies_where(routes=True))


def self_route_diagnostics(
    df: Any, metric: str = "string_match_all", threshold: float = 1.0
) -> Any:
    """Per Self-Route variant: ``n`` scored queries, ``routed`` (fell back to long context after
    the model declined), ``routing_rate``, ``accuracy`` (share with score >= ``threshold``) and
    the accuracy of the ``unrouted`` (answered by RAG) and ``routed`` queries."""
    import pandas as pd

    df = with_labels(df)
    _check_metric(df, metric)
    columns = [
        "label",
        "n",
        "routed",
        "routing_rate",
        "accuracy",
        "accuracy_unrouted",
        "accuracy_routed",
    ]
    sr = df[_router_rows(df)]
    if sr.empty:
        return pd.DataFrame(columns=columns)
    if "route" not in sr.columns:
        names = ", ".join(dict.fromkeys(sr["strategy"]))
        raise ValueError(
            f"{names} rows have no 'route' column; was the run made by ragbench.experiment.runner?"
        )
    rows = []
    for label, group in _scored(sr, metric).groupby("label", sort=False):
        routed = group["route"] == FULL_CONTEXT
        correct = group[metric] >= threshold
        rows.append({
            "label": label, "n": len(group), "routed": int(routed.sum()),
            "routing_rate": float(routed.mean()) if len(group) else float("nan"),
            "accuracy": float(correct.mean()) if len(group) else float("nan"),
            "accuracy_unrouted": float(correct[~routed].mean()) if (~routed).any() else float("nan"),
            "accuracy_routed": float(correct[routed].mean()) if routed.any() else float("nan"),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def self_route_warnings(df: Any, metric: str = "string_match_all") -> list[str]:
    """Plain-language warnings about Self-Route runs that did not route: the model never
    declined (Self-Route is then RAG with a longer prompt) or always declined (long context
    plus a wasted RAG call). Empty when there is nothing to say."""
    if "strategy" not in df or not _router_rows(df).any() or metric not in df or "route" not in df:
        return []  # summary calls this on any table: nothing to say is not an error
    out = []
    for row in self_route_diagnostics(df, metric).itertuples(index=False):
        if row.n and row.routed == 0:
            out.append(
                f"Self-Route '{row.label}' never routed: the model declined none of {row.n} "
                "queries, so every answer came from RAG; Self-Route equals RAG here and says "
                "nothing about routing (a model that does not follow the 'unanswerable' "
                "instruction, or retrieval that always looked sufficient)."
            )
        elif row.n and row.routed == row.n:
            out.append(
                f"Self-Route '{row.label}' routed all {row.n} queries to long context: it costs "
                "long context plus a RAG call that was never used."
            )
    return out
