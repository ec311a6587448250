"""The summary table: accuracy with a 95% CI (Wilson for 0/1 scores, else bootstrap) and mean
cost per query, one row per strategy variant, with the notes that say what its numbers rest on
(few questions, unscored ones, empty answers); its Pareto front; and RULER's effective context
length."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragbench.analysis._common import _check_metric, check_one_row_each, own_latency_seconds
from ragbench.analysis.answers import EMPTY_SHARE, count_empty_answers
from ragbench.analysis.labels import with_labels
from ragbench.analysis.self_route import self_route_warnings
from ragbench.judge.agreement import judge_warnings
from ragbench.metrics.answer import aggregate

if TYPE_CHECKING:
    import pandas as pd

# the per-query cost columns a summary table averages (the oracle's rows too), in display
# order; measured KV-cache bytes when the transformers backend measured them. The amortised_*
# columns add each query's share of a one-time cost (a preloaded corpus; equal to dollars /
# resource_seconds where there is none)
SUMMARY_COST_COLUMNS = (
    "prompt_tokens",
    "dollars",
    "amortised_dollars",
    "resource_seconds",
    "amortised_resource_seconds",
    "latency_seconds",
    "kv_bytes_measured",
    "flops",
)


# fewer scored questions than this and a variant's row gets a note: its interval is wide
SMALL_N = 30


def small_n_notes(table: pd.DataFrame, min_n: int = SMALL_N) -> list[str]:
    """One plain sentence naming the rows of a summary-like table (``label``, ``n``) with fewer
    than ``min_n`` scored questions, or nothing."""
    small = [(lb, int(n)) for lb, n in zip(table["label"], table["n"], strict=True) if n < min_n]
    if not small:
        return []
    if len(small) == len(table) > 1:  # every row: one count, not a list of every label
        low, high = min(n for _, n in small), max(n for _, n in small)
        rows = f"every variant (n={low})" if low == high else f"every variant (n={low} to {high})"
    else:
        rows = ", ".join(f"{lb} (n={n})" for lb, n in small)
    return [f"fewer than {min_n} questions for: {rows}; intervals are wide"]


def empty_answer_notes(df: pd.DataFrame, share: float = EMPTY_SHARE) -> list[str]:
    """One sentence per strategy variant more than ``share`` of whose answers are empty
    (``analysis.answers.count_empty_answers``, which the verdict reads too): ``62 of 72 answers
    empty for long_context: check the server's chat template and stop strings``."""
    if "prediction" not in df or not len(df):
        return []
    return [e.text for e in count_empty_answers(with_labels(df), share)]


def unscored_notes(table: pd.DataFrame, asked: pd.Series, metric: str) -> list[str]:
    """One sentence when some variant answered more questions (``asked``: label -> rows
    answered) than it has scores for (``table``'s ``n``; a question without a gold answer):
    the score is over the scored ones, cost per query over all, with the counts."""
    rows = [
        (lb, int(n), int(asked.get(lb, 0)))
        for lb, n in zip(table["label"], table["n"], strict=True)
        if asked.get(lb, 0) > n
    ]
    if not rows:
        return []
    if len(rows) == len(table) > 1 and len({(n, a) for _, n, a in rows}) == 1:
        counts = f"every variant {rows[0][1]} of {rows[0][2]}"
    else:
        counts = ", ".join(f"{lb} {n} of {a}" for lb, n, a in rows)
    return [
        f"{metric} is over the scored questions ({counts}); cost and latency per query are "
        "over every question answered (one without a gold answer has no score but was "
        "asked and paid for)"
    ]


def summary(df: pd.DataFrame, metric: str | None = None, seed: int = 0) -> pd.DataFrame:
    """Accuracy with a 95% CI and mean cost per query, one row per strategy variant.

    ``metric`` defaults to the table's first metric column (the config's first metric). The CI
    is a Wilson score interval when every score is 0 or 1, else a percentile bootstrap
    (``ci_method`` says which; ``metrics.answer.aggregate``); ``n`` counts the scored questions.
    Cost columns are means over the variant's successful rows, scored or not (a question
    without a gold answer was still asked and paid for): prompt tokens, $/query (when a price
    sheet was set), latency seconds, and estimated FLOPs. ``attrs["warnings"]`` lists what the
    numbers hide (a Self-Route that never routed: every answer came from its RAG step; a judge
    metric's low agreement with exact match, or an embedded judge). ``attrs["notes"]`` says
    which rows rest on fewer than ``SMALL_N`` questions, and where ``n`` is fewer than the
    questions answered, what the score and the costs are each over, and which variants answered
    empty in more than a tenth of their rows (``empty_answer_notes``). Both are said once, where the
    table is shown: ``report.formatted`` puts them in its caption, ``ragbench run`` prints them
    under it (``report.tables.table_remarks``); they are not raised as Python warnings, which
    would repeat them with a source path beside the caption.
    """
    import pandas as pd

    df = with_labels(df)
    check_one_row_each(df)  # two runs concatenated would count each question twice
    metric = _check_metric(df, metric)
    acc = aggregate(df, ["label"], metric, seed=seed).set_index("label")
    ok = df[df["error"].isna()] if "error" in df else df
    if "latency_seconds" in ok:  # its own time (a table written when it included the queue)
        ok = ok.assign(latency_seconds=own_latency_seconds(ok))
    cost_cols = [c for c in SUMMARY_COST_COLUMNS if c in ok]
    costs = ok.groupby("label")[cost_cols].mean(numeric_only=True) if cost_cols else None
    columns = ["mean", "ci_low", "ci_high", "n", "n_missing", "ci_method"]
    table = acc[columns].rename(columns={"mean": metric})
    if costs is not None:
        table = table.join(costs)
    order = pd.Index(df.drop_duplicates("label")["label"])  # first-seen order = config order
    out = table.reindex(order).reset_index()
    out.attrs["metric"] = metric
    asked = ok.groupby("label").size()
    out.attrs["notes"] = [
        *small_n_notes(out),
        *unscored_notes(out, asked, metric),
        *empty_answer_notes(df),
    ]
    out.attrs["warnings"] = self_route_warnings(df, metric)
    if metric.startswith("judge_"):  # how far the judge can be trusted, next to its numbers
        out.attrs["warnings"] += judge_warnings(df)
    return out


def pareto_front(table: pd.DataFrame, cost: str, metric: str) -> pd.DataFrame:
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
    df: pd.DataFrame,
    metric: str | None = None,
    threshold: float = 0.85,
    length: str = "context_length",
) -> pd.DataFrame:
    """RULER-style effective length per strategy variant: the longest tested length such that the
    mean score at it and at every shorter length stays at or above ``threshold`` (NaN if none).
    ``metric`` defaults to the table's first metric column.

    Columns: ``label``, ``effective_length``, ``censored`` (True when it is the longest length
    tested: the true effective length is at least that, maybe more; ``report.formatted`` shows
    it as ``≥ 8,192``), ``longest_tested`` and ``threshold``."""
    import pandas as pd

    df = with_labels(df)
    check_one_row_each(df)
    metric = _check_metric(df, metric)
    means = df.groupby(["label", length])[metric].mean().reset_index().sort_values(length)
    rows = []
    for label, group in means.groupby("label", sort=False):
        effective = float("nan")
        for n, score in zip(group[length], group[metric], strict=True):
            if score < threshold:
                break
            effective = n
        longest = group[length].max()
        rows.append(
            {
                "label": label,
                "effective_length": effective,
                "censored": bool(effective == longest),
                "longest_tested": longest,
                "threshold": threshold,
            }
        )
    return pd.DataFrame(rows)
