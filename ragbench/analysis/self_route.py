"""Self-Route's diagnostics: how often a router fell back to long context, how accurate each
branch was, and a warning when it never (or always) routed. Router rows are the strategies that
declare ``routes``; a row's ``route`` names the source that answered."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from ragbench.analysis._common import (
    _check_metric,
    _scored,
    check_one_row_each,
    counted,
    metric_columns,
)
from ragbench.analysis.labels import with_labels
from ragbench.strategies import FULL_CONTEXT, RETRIEVED, strategies_where

if TYPE_CHECKING:
    import pandas as pd


def _router_rows(df: pd.DataFrame) -> pd.Series:
    """Which rows of ``df`` a router (a strategy that declares ``routes``) wrote."""
    return df["strategy"].isin(strategies_where(routes=True))


def self_route_diagnostics(
    df: pd.DataFrame, metric: str | None = None, threshold: float = 1.0
) -> pd.DataFrame:
    """Per Self-Route variant: ``n`` queries answered (scored or not: a query without a gold
    answer was routed all the same), ``routed`` (fell back to long context after the model
    declined), ``routing_rate`` (of ``n``), ``n_scored``, ``accuracy`` (share of the scored
    queries with score >= ``threshold``) and the accuracy of the scored ``unrouted`` (answered
    by RAG) and ``routed`` queries. ``metric`` defaults to the table's first metric column."""
    import pandas as pd

    df = with_labels(df)
    check_one_row_each(df)
    metric = _check_metric(df, metric)
    columns = [
        "label",
        "n",
        "routed",
        "routing_rate",
        "n_scored",
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
    answered = sr[sr["error"].isna()] if "error" in sr else sr
    for label, group in answered.groupby("label", sort=False):
        routed = group["route"] == FULL_CONTEXT
        scores = group[metric]
        rows.append(
            {
                "label": label,
                "n": len(group),
                "routed": int(routed.sum()),
                "routing_rate": float(routed.mean()),
                "n_scored": int(scores.notna().sum()),
                "accuracy": _share(scores, threshold),
                "accuracy_unrouted": _share(scores[~routed], threshold),
                "accuracy_routed": _share(scores[routed], threshold),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _share(scores: pd.Series, threshold: float) -> float:
    """The share of the scored values at or above ``threshold`` (NaN: none scored)."""
    scored = scores.dropna()
    return float((scored >= threshold).mean()) if len(scored) else math.nan


def _rag_twin(df: pd.DataFrame, label: str) -> str | None:
    """The RAG variant that retrieved as Self-Route variant ``label`` did: a strategy that reads
    retrieved chunks and builds an index, whose every parameter the router shares (its own
    parameters extend RAG's). None when the run has none."""
    params = df.loc[df["label"] == label, "params"] if "params" in df else None
    if params is None or params.empty:
        return None
    mine = _params(params.iloc[0])
    rag = df[df["strategy"].isin(strategies_where(context=RETRIEVED, needs_retrieval=True))]
    for other, group in rag.groupby("label", sort=False):
        theirs = _params(group["params"].iloc[0])
        if theirs is not None and mine is not None and theirs.items() <= mine.items():
            return str(other)
    return None


def _params(text: object) -> dict[str, object] | None:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {k: json.dumps(v, sort_keys=True) for k, v in value.items()}  # hashable, comparable


def _percent(value: float) -> str:
    return f"{100 * value:.1f}".removesuffix(".0") + "%"


def _never_routed(df: pd.DataFrame, label: str, n: int, metric: str) -> str:
    """What a Self-Route variant that never routed does and does not say, with its accuracy
    beside the RAG variant's that retrieved the same way, on the same questions: its RAG step
    reads another prompt (the 'unanswerable' option), so the two need not agree."""
    text = (
        f"Self-Route '{label}' never routed: the model declined none of {n} queries, so every "
        "answer came from its RAG step and the run says nothing about routing (a model that "
        "does not follow the 'unanswerable' instruction, or retrieval that always looked "
        "sufficient)."
    )
    twin = _rag_twin(df, label)
    if twin is None:
        return text
    mine = _scored(df[df["label"] == label], metric)
    theirs = _scored(df[df["label"] == twin], metric)
    shared = set(mine["example_id"]) & set(theirs["example_id"]) if "example_id" in df else set()
    if not shared:
        return text
    a = float(mine[mine["example_id"].isin(shared)][metric].mean())
    b = float(theirs[theirs["example_id"].isin(shared)][metric].mean())
    on = f"on {metric} over the same {counted(len(shared), 'question')}"
    if abs(a - b) < 1e-9:
        return f"{text} It scored {_percent(a)}, as '{twin}' did, {on}."
    return (
        f"{text} It scored {_percent(a)} against {_percent(b)} for '{twin}' {on}: its RAG "
        "step's prompt differs from RAG's (the 'unanswerable' option), not its routing."
    )


def self_route_warnings(df: pd.DataFrame, metric: str | None = None) -> list[str]:
    """Plain-language warnings about Self-Route runs that did not route: the model never
    declined (every answer came from its RAG step; its accuracy is set beside the RAG variant's
    that retrieved the same way, which its different prompt need not match) or always declined
    (long context plus a wasted RAG call). Empty when there is nothing to say. ``metric``
    defaults to the table's first metric column."""
    if "strategy" not in df or not _router_rows(df).any() or "route" not in df:
        return []  # summary calls this on any table: nothing to say is not an error
    metric = metric if metric is not None else next(iter(metric_columns(df)), None)
    if metric is None or metric not in df:
        return []
    df = with_labels(df)
    out = []
    diag = self_route_diagnostics(df, metric)
    for label, n, routed in zip(diag["label"], diag["n"], diag["routed"], strict=True):
        if n and routed == 0:
            out.append(_never_routed(df, label, n, metric))
        elif n and routed == n:
            out.append(
                f"Self-Route '{label}' routed all {n} queries to long context: it costs "
                "long context plus a RAG call that was never used."
            )
    return out
