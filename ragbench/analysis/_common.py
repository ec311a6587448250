"""Helpers every analysis shares: metric and label checks, scored rows, paired scores."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ragbench.analysis.labels import with_labels
from ragbench.metrics.answer import METRICS
from ragbench.registry import unknown


def _check_metric(df: Any, metric: str) -> None:
    if metric not in df.columns:
        scored = [c for c in df.columns if c in METRICS] or list(df.columns)
        raise unknown("metric column", metric, scored)


def _check_labels(df: Any, labels: Iterable[str] | None) -> list[str]:
    """The variants to analyse in first-seen (config) order; unknown names are an error."""
    seen = list(dict.fromkeys(df["label"]))
    if labels is None:
        return seen
    labels = list(labels)
    for label in labels:
        if label not in seen:
            raise unknown("strategy label", label, seen)
    return labels


def _scored(df: Any, metric: str) -> Any:
    """Rows that have a score: error rows (no score) are excluded, as in ``summary``."""
    ok = df["error"].isna() if "error" in df else np.ones(len(df), dtype=bool)
    return df[ok & df[metric].notna()]


def _higher_is_better(metric: str) -> bool:
    return METRICS.get(metric).higher_is_better if metric in METRICS else True


def paired_scores(df: Any, metric: str, labels: Iterable[str] | None = None) -> Any:
    """Questions x variants matrix of ``metric`` (NaN where a variant has no score for a
    question). Two rows for the same (question, variant), e.g. two runs concatenated, are an
    error: pairing would silently pick one."""
    df = with_labels(df)
    _check_metric(df, metric)
    labels = _check_labels(df, labels)
    rows = _scored(df[df["label"].isin(labels)], metric)
    dup = rows.duplicated(["example_id", "label"])
    if dup.any():
        first = rows[dup].iloc[0]
        raise ValueError(
            f"{int(dup.sum())} duplicate (example_id, label) rows, e.g. "
            f"({first['example_id']!r}, {first['label']!r}): one row per question and variant"
        )
    wide = rows.pivot(index="example_id", columns="label", values=metric).astype(float)
    return wide.reindex(columns=labels)
