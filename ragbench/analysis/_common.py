"""Helpers every analysis shares: the default metric, metric and label checks, one row per
question and variant, scored rows, paired scores."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ragbench.analysis.labels import with_labels
from ragbench.metrics.answer import METRICS
from ragbench.registry import unknown

if TYPE_CHECKING:
    import pandas as pd


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 question``, ``1,200 questions``
    (``noun`` may carry words before it: ``paired question``)."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def own_latency_seconds(df: pd.DataFrame) -> pd.Series | None:
    """Each row's own latency (retrieval search + prefill + decode; the harness's queue apart),
    the column every analysis reads: ``latency_seconds`` as floats. None without that column."""
    if "latency_seconds" not in df:
        return None
    return df["latency_seconds"].astype(float)


def metric_columns(df: pd.DataFrame) -> list[str]:
    """The answer-metric columns of ``df`` in column order: columns named after a registered
    metric (``ragbench.metrics.METRICS``: string, judge and embedding metrics). The runner
    writes them in the config's metric order; a summary table holds the one it summarises."""
    return [str(c) for c in df.columns if c in METRICS]


def default_metric(df: pd.DataFrame) -> str:
    """The metric an analysis uses when none is named: the one a derived table says it holds
    (``attrs["metric"]``, as ``summary`` sets it), else the first answer-metric column of ``df``
    (the run's first metric). A table with none is an error that names its columns."""
    named = df.attrs.get("metric")
    if isinstance(named, str) and named in df.columns:
        return named
    found = metric_columns(df)
    if not found:
        raise ValueError(
            "no answer-metric column in the table; its columns are "
            f"{', '.join(map(str, df.columns)) or '(none)'}; metric columns are named after a "
            f"registered metric ({', '.join(METRICS)})"
        )
    return found[0]


def resolve_metric(df: pd.DataFrame, metric: str | None) -> str:
    """``metric``, or ``default_metric(df)`` when it is None; a name that is not a column is an
    error naming the metric columns there are."""
    if metric is None:
        metric = default_metric(df)
    elif metric not in df.columns:
        scored = metric_columns(df) or list(df.columns)
        raise unknown("metric column", metric, scored)
    check_metric_version(df, metric)
    check_some_succeeded(df)
    return metric


def error_summary(errors: Iterable[str | None], limit: int = 5) -> list[tuple[str, int]]:
    """The most frequent error messages (an ``error`` column: None for good rows) with their
    counts, most frequent first, ties in first-seen order: what a failed run prints."""
    return Counter(e for e in errors if isinstance(e, str) and e).most_common(limit)


def check_some_succeeded(df: pd.DataFrame) -> None:
    """A table whose every record failed has nothing to analyse: an error saying why they
    failed (the most frequent errors), instead of a missing column further on."""
    if "error" not in df.columns or not len(df) or df["error"].isna().any():
        return
    top = "; ".join(f"{n} x {message}" for message, n in error_summary(df["error"], limit=2))
    raise ValueError(f"all {len(df)} records failed, so there is nothing to compare: {top}")


def check_metric_version(df: pd.DataFrame, metric: str) -> None:
    """Rows scored by different versions of ``metric`` (tables of runs made before and after a
    scoring fix, concatenated; each run records its ``metric_versions``) are not compared: an
    error naming the versions."""
    if "metric_versions" not in df.columns:
        return
    seen = {json.loads(v).get(metric) for v in df["metric_versions"].dropna().unique()}
    seen.discard(None)
    if len(seen) > 1:
        raise ValueError(
            f"the rows were scored with {metric!r} versions {sorted(seen)} (runs made before and "
            "after a scoring change): rerun the older run so every row is scored alike, or "
            "compare rows of one version"
        )


_check_metric = resolve_metric  # the name the analysis modules import


class DuplicateRowsError(ValueError):
    """A table with two rows for one (question, variant): the message says how to fix it."""


def check_one_row_each(df: pd.DataFrame) -> None:
    """Every table an analysis reads holds one row per (``example_id``, ``label``): a summary's
    ``n``, a paired table's pairs and a router's choices count rows. Two runs concatenated
    (``pd.concat([run_a, run_b])``) repeat every pair and would be counted twice, silently
    (``n`` = 12 for 6 questions), or one row picked at random: DuplicateRowsError, one line
    naming the fix. Each analysis calls this at its entry, after ``with_labels``; a table
    without those columns (a derived one) is not a results table and passes."""
    if "example_id" not in df or "label" not in df:
        return
    dup = df.duplicated(["example_id", "label"])
    if not dup.any():
        return
    first = df[dup].iloc[0]
    raise DuplicateRowsError(
        f"{counted(int(dup.sum()), 'duplicated (example_id, label) row')} (e.g. "
        f"({first['example_id']!r}, {first['label']!r})): two runs concatenated? load them with "
        "ragbench.load([run_a, run_b]) (labels name their run) or pair them with ragbench diff / "
        "report.compare_runs"
    )


def _check_labels(df: pd.DataFrame, labels: Iterable[str] | None) -> list[str]:
    """The variants to analyse in first-seen (config) order; unknown names are an error."""
    seen = list(dict.fromkeys(df["label"]))
    if labels is None:
        return seen
    labels = list(labels)
    for label in labels:
        if label not in seen:
            raise unknown("strategy label", label, seen)
    return labels


def _scored(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows that have a score: error rows (no score) are excluded, as in ``summary``."""
    ok = df["error"].isna() if "error" in df else np.ones(len(df), dtype=bool)
    return df[ok & df[metric].notna()]


def _higher_is_better(metric: str) -> bool:
    return METRICS.get(metric).higher_is_better if metric in METRICS else True


def paired_scores(
    df: pd.DataFrame, metric: str | None = None, labels: Iterable[str] | None = None
) -> pd.DataFrame:
    """Questions x variants matrix of ``metric`` (default: the table's first metric column;
    NaN where a variant has no score for a question). Two rows for the same (question, variant),
    e.g. two runs concatenated, are an error (``check_one_row_each``): pairing would silently
    pick one."""
    df = with_labels(df)
    check_one_row_each(df)
    metric = _check_metric(df, metric)
    labels = _check_labels(df, labels)
    rows = _scored(df[df["label"].isin(labels)], metric)
    wide = rows.pivot(index="example_id", columns="label", values=metric).astype(float)
    return wide.reindex(columns=labels)
