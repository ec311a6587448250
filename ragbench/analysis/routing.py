"""The oracle router: per question the cheapest variant that answered right, and how much any
router could gain over Self-Route and every fixed strategy."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ragbench.analysis._common import _check_labels, _check_metric, _scored, check_one_row_each
from ragbench.analysis.labels import with_labels
from ragbench.analysis.summary import SUMMARY_COST_COLUMNS, small_n_notes, summary
from ragbench.metrics.answer import mean_ci
from ragbench.registry import unknown
from ragbench.strategies import strategies_where

if TYPE_CHECKING:
    import pandas as pd

# cost is money, else the device time charged (resource seconds);
# never latency, which is what a user waited, not what the query cost
COST_PREFERENCE = ("dollars", "resource_seconds")


def pick_cost(df: pd.DataFrame, cost: str | None = None) -> str:
    """The cost column to minimise: ``cost`` if given (it must exist), else the first of
    ``COST_PREFERENCE`` known for every scored row: dollars (a price sheet was set), else the
    device seconds charged (self-hosted)."""
    if cost is not None:
        if cost not in df.columns:
            raise unknown("cost column", cost, [c for c in COST_PREFERENCE if c in df.columns])
        return cost
    ok = df[df["error"].isna()] if "error" in df else df
    for name in COST_PREFERENCE:
        if name in ok.columns and ok[name].notna().all() and len(ok):
            return name
    raise ValueError(f"no cost column known for every row; looked for {', '.join(COST_PREFERENCE)}")


def oracle_router(
    df: pd.DataFrame,
    metric: str | None = None,
    cost: str | None = None,
    threshold: float = 1.0,
    labels: Iterable[str] | None = None,
) -> pd.DataFrame:
    """Per question, the variant an all-knowing router would send it to: the cheapest (by
    ``cost``, see ``pick_cost``) whose score reached ``threshold``; where none did, the cheapest
    of all (knowing every answer is wrong, it spends least). ``metric`` defaults to the table's
    first metric column. Candidates: ``labels``, default every variant except Self-Route (itself
    a router). Only questions every candidate answered without error count, so each choice is
    made among the same options.

    One row per question: ``example_id``, ``label`` chosen, ``correct``, the metric, the cost
    column and every summary cost column of the chosen record. ``attrs["cost"]`` names the cost.
    """
    df = with_labels(df)
    check_one_row_each(df)
    metric = _check_metric(df, metric)
    if labels is None:  # every variant but the routers
        routers = strategies_where(routes=True)
        labels = [
            lb
            for lb, s in df.drop_duplicates("label")[["label", "strategy"]].values
            if s not in routers
        ]
    labels = _check_labels(df, labels)
    if not labels:
        raise ValueError("no candidate variants for the oracle router (only Self-Route?)")
    rows = _scored(df[df["label"].isin(labels)], metric)
    cost = pick_cost(rows, cost)
    complete = rows.groupby("example_id")["label"].nunique() == len(labels)
    rows = rows[rows["example_id"].isin(complete[complete].index)].copy()
    rows["correct"] = rows[metric] >= threshold
    rank = {label: i for i, label in enumerate(labels)}
    rows["_rank"] = rows["label"].map(rank)  # ties in cost: the first variant in config order
    # correct first, then cheapest: the first row per question is the oracle's choice
    rows = rows.sort_values(
        ["example_id", "correct", cost, "_rank"], ascending=[True, False, True, True]
    )
    chosen = rows.drop_duplicates("example_id").drop(columns="_rank")
    keep = ["example_id", "label", "correct", metric, cost]
    keep += [c for c in SUMMARY_COST_COLUMNS if c in chosen and c not in keep]
    out = chosen[keep].reset_index(drop=True)
    out.attrs.update(cost=cost, metric=metric, threshold=threshold, candidates=labels)
    return out


ORACLE_LABEL = "oracle router"


def router_headroom(  # oracle_router's parameters, passed on to it, and the intervals' seed
    df: pd.DataFrame,
    metric: str | None = None,
    cost: str | None = None,
    threshold: float = 1.0,
    labels: Iterable[str] | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """``summary``'s table on the questions the oracle saw, plus one ``oracle router``
    row (its accuracy with a 95% CI of the same kind as the table's, Wilson or bootstrap, and
    the mean cost of its choices), plus ``oracle_gain``: how much accuracy the oracle adds over
    each row; ``attrs["notes"]`` flags rows on few questions, as ``summary``'s. Pass it to
    ``report.plot_accuracy_vs_cost`` to put the oracle on the accuracy-cost plot."""
    import pandas as pd

    df = with_labels(df)
    check_one_row_each(df)
    metric = _check_metric(df, metric)
    choices = oracle_router(df, metric, cost, threshold, labels)
    cost = choices.attrs["cost"]
    questions = set(choices["example_id"])
    with warnings.catch_warnings():  # summary's Self-Route warnings were shown with its table
        warnings.simplefilter("ignore", UserWarning)
        base = summary(df[df["example_id"].isin(questions)], metric=metric, seed=seed)
    if cost not in base.columns:  # not a summary column: add it for the plot
        ok = _scored(df[df["example_id"].isin(questions)], metric)
        base[cost] = base["label"].map(ok.groupby("label")[cost].mean())
    scores = choices[metric].to_numpy(dtype=float)
    method = base["ci_method"].iloc[0] if len(base) else None  # the same kind as the table's
    lo, hi, method = mean_ci(scores, seed=seed, method=method)
    oracle = {
        "label": ORACLE_LABEL,
        metric: float(scores.mean()) if scores.size else float("nan"),
        "ci_low": lo,
        "ci_high": hi,
        "n": int(scores.size),
        "n_missing": 0,
        "ci_method": method,
        **{
            c: float(choices[c].mean())
            for c in base.columns
            if c in choices and c not in ("label", metric)
        },
    }
    table = pd.concat([base, pd.DataFrame([oracle])], ignore_index=True)
    table["oracle_gain"] = table.loc[table["label"] == ORACLE_LABEL, metric].iloc[0] - table[metric]
    table.attrs.update(cost=cost, metric=metric, candidates=choices.attrs["candidates"])
    table.attrs["notes"] = small_n_notes(table)
    return table
