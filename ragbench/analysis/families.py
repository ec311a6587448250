"""The verdict's sides: each variant's family (retrieval, long context, the closed-book baseline),
how much machinery it adds over the plain form of its family, and each family's best variant.

Families come from what a strategy declares (``strategies.registry``), never from its name:
answers read from retrieved chunks, or routed (Self-Route), are retrieval (RAG, Self-Route, a
user's pipeline); answers read from the whole context are long context (with its KV-cache
variants); answers read from nothing are the baseline. The verdict sets the best retrieval
variant against the best long-context one; closed book is the line both must clear.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ragbench.analysis.self_route import _rag_twin
from ragbench.strategies import FULL_CONTEXT, NO_CONTEXT, RETRIEVED, strategies_where

if TYPE_CHECKING:
    import pandas as pd

RETRIEVAL, LONG_CONTEXT, BASELINE, OTHER = "retrieval", "long context", "baseline", "other"


def family(strategy: str) -> str:
    """``RETRIEVAL``, ``LONG_CONTEXT``, ``BASELINE`` or ``OTHER`` (a strategy this version does
    not know, or one that gives no answer)."""
    if strategy in strategies_where(context=NO_CONTEXT):
        return BASELINE
    if strategy in strategies_where(context=FULL_CONTEXT):
        return LONG_CONTEXT
    if strategy in strategies_where(context=RETRIEVED) or strategy in strategies_where(routes=True):
        return RETRIEVAL
    return OTHER


def machinery(strategy: str, params: Any) -> tuple[str, ...]:
    """What a variant adds over the plain form of its family, in words (empty: nothing): a
    router's extra call and routing step; a KV-cache technique, a preloaded corpus or RoPE
    scaling on long context. Ties go to the variant with less."""
    if strategy in strategies_where(routes=True):
        return ("a routing step",)
    if strategy not in strategies_where(context=FULL_CONTEXT):
        return ()
    p = _params(params)
    out = []
    kv = (p.get("kv") or {}).get("name") if isinstance(p.get("kv"), dict) else None
    if kv not in (None, "plain"):
        out.append(f"the {kv} KV cache")
    if p.get("preload"):
        out.append("a preloaded corpus")
    if p.get("rope_scaling"):
        out.append(f"RoPE scaling {p['rope_scaling']}")
    return tuple(out)


def _params(params: object) -> dict[str, Any]:
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            return {}
    return dict(params) if isinstance(params, dict) else {}


def annotate(df: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one row per variant, indexed by label, with ``strategy``) with ``family``,
    ``machinery`` (a tuple of words) and ``never_routed`` (a router none of whose scored
    answers came from long context) and ``twin`` (the RAG variant that retrieved as a router
    did, where the run has one)."""
    out = table.copy()
    strategies = out["strategy"].fillna("").astype(str)
    params: pd.Series | dict[str, object] = (
        df.drop_duplicates("label").set_index("label")["params"] if "params" in df else {}
    )
    out["family"] = [family(s) for s in strategies]
    out["machinery"] = [
        machinery(s, params.get(lb) if len(params) else None)
        for lb, s in zip(out.index, strategies, strict=True)
    ]
    routers = set(strategies_where(routes=True))
    never, twins = [], []
    for label, strategy in zip(out.index, strategies, strict=True):
        rows = df[df["label"] == label]
        router = strategy in routers and "route" in rows
        never.append(bool(router and len(rows) and (rows["route"] != FULL_CONTEXT).all()))
        twins.append(_rag_twin(df, label) if router else None)
    out["never_routed"] = never
    out["twin"] = twins
    return out
