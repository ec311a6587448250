"""Variant labels: the name every table and figure shows for a (strategy, parameters) pair."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ragbench.strategies import params_from_dict

if TYPE_CHECKING:
    import pandas as pd


def strategy_label(strategy: str, params: str | dict[str, object]) -> str:
    """Short human label for a (strategy, params) pair: ``rag k=4 order=document`` (the
    strategy's parameter class decides; ``params`` may be a results table's JSON text)."""
    params = json.loads(params) if isinstance(params, str) else dict(params or {})
    return params_from_dict(strategy, params).label()


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``label`` column (results tables carry one; older tables get it here)."""
    if "label" in df:
        return df
    out = df.copy()
    out["label"] = [
        strategy_label(s, p) for s, p in zip(out["strategy"], out["params"], strict=True)
    ]
    return out
