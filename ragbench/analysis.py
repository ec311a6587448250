"""Analysis that decides: paired comparison, failure attribution, oracle-router headroom and
Self-Route diagnostics. Every function takes the results table (one row per example, strategy
and parameter point; ``label`` names the variant) and returns a table; plots live in
``ragbench.report``.

- ``compare``: every pair of variants on the *same* questions. Averages with overlapping CIs hide
  a consistent per-question difference (and overlapping-looking CIs can hide none); pairing
  removes the question-difficulty variance both share. Binary metrics get an exact McNemar test
  (a two-sided binomial test on the discordant pairs), every metric a paired bootstrap CI of the
  mean difference; p-values are Holm-adjusted over the pairs, because with k variants there are
  k(k-1)/2 chances to find a "winner" by luck.
- ``attribute``: why each wrong answer was wrong (retrieval, reader, distractor, truncation),
  from the record's meta and, when given, the examples (evidence spans, needles).
- ``oracle_router``/``router_headroom``: per question the cheapest variant that answered right;
  how much any router could gain over Self-Route and every fixed strategy.
- ``self_route_diagnostics``/``self_route_warnings``: how often Self-Route fell back to long
  context and how accurate each branch was; a warning when it never did (it then equals RAG).

Pure pandas/numpy; nothing here loads a model.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ragbench.registry import unknown

# ---------------------------------------------------------------------------- shared helpers


def _labels(df: Any) -> Any:
    from ragbench.report import with_labels  # lazy: report imports this module

    return with_labels(df)


def _check_metric(df: Any, metric: str) -> None:
    if metric not in df.columns:
        from ragbench.metrics import METRICS

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
    """Rows that have a score: error rows (no score) are excluded, as in ``report.summary``."""
    ok = df["error"].isna() if "error" in df else np.ones(len(df), dtype=bool)
    return df[ok & df[metric].notna()]


def _higher_is_better(metric: str) -> bool:
    from ragbench.metrics import METRICS

    return METRICS.get(metric).higher_is_better if metric in METRICS else True


def paired_scores(df: Any, metric: str, labels: Iterable[str] | None = None) -> Any:
    """Questions x variants matrix of ``metric`` (NaN where a variant has no score for a
    question). Two rows for the same (question, variant), e.g. two runs concatenated, are an
    error: pairing would silently pick one."""
    df = _labels(df)
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


# ---------------------------------------------------------------------------- paired comparison


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: under H0 each discordant pair (one variant right, the
    other wrong) is a fair coin, so ``a_only ~ Binomial(a_only + b_only, 1/2)``. The two-sided
    p is twice the smaller tail (the distribution is symmetric), capped at 1; no discordant pairs
    give 1. Exact integer arithmetic: no overflow at any n."""
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_bootstrap(
    diffs: Sequence[float], n_boot: int = 2000, seed: Any = 0, level: float = 0.05
) -> tuple[float, float, float]:
    """(ci_low, ci_high, p) for the mean of per-question differences: resample questions with
    replacement (each resample keeps a question's two answers together), percentile CI at
    ``1 - level``, and a two-sided p as twice the smaller share of resampled means on either
    side of 0 (so ``p < level`` when the percentile CI excludes 0, up to interpolation).
    Resampling draws ``rng.integers(0, n, (n_boot, n))`` from ``default_rng(seed)``, the same
    draws as ``scipy.stats.bootstrap(..., paired=True, rng=default_rng(seed))``."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2 or n_boot < 1:
        value = float(d[0]) if d.size == 1 else float("nan")
        return value, value, float("nan")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    lo, hi = np.percentile(means, [100 * level / 2, 100 * (1 - level / 2)])
    p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    return float(lo), float(hi), p


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and is not counted)."""
    p = np.asarray(p_values, dtype=float)
    valid = np.flatnonzero(~np.isnan(p))
    out = np.full(p.shape, np.nan)
    m, running = len(valid), 0.0
    for rank, i in enumerate(valid[np.argsort(p[valid], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))  # monotone: never below a smaller p
        out[i] = running
    return out.tolist()


def compare(
    df: Any,
    metric: str = "string_match_all",
    level: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
    labels: Iterable[str] | None = None,
    adjust: str = "holm",
) -> Any:
    """Every pair of variants on the questions both answered (inner join on ``example_id``).

    One row per pair (a, b), in config order: ``n`` paired questions, ``mean_a``, ``mean_b``,
    ``diff`` (= mean_a - mean_b) with its paired bootstrap CI at ``1 - level`` (``ci_low``,
    ``ci_high``), ``a_only``/``b_only`` (questions where a scored higher / b scored higher),
    ``test`` and ``p_value``: exact McNemar when the metric is binary (every score 0 or 1), else
    the paired bootstrap p. ``p_adjusted`` is Holm's over all pairs (``adjust="none"``: the raw
    p), ``significant`` is ``p_adjusted < level`` and ``winner`` names the better variant only
    then (lower is better for metrics that say so). ``decide`` turns the table into sentences.

    The decision rests on the test's p, not on the CI: on few questions the exact McNemar test
    is conservative (5 discordant pairs all one way give p = 0.0625) while a percentile bootstrap
    CI is too narrow and can exclude 0; both are shown.
    """
    import pandas as pd

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if adjust not in ("holm", "none"):
        raise unknown("p-value adjustment", adjust, ("holm", "none"))
    wide = paired_scores(df, metric, labels)
    values = wide.to_numpy()
    binary = bool(np.isin(values[~np.isnan(values)], (0.0, 1.0)).all())
    higher = _higher_is_better(metric)
    cols = list(wide.columns)
    rows = []
    for i, a in enumerate(cols):
        for b in cols[i + 1 :]:
            both = wide[[a, b]].dropna()
            x, y = both[a].to_numpy(), both[b].to_numpy()
            d = x - y
            # an independent stream per pair, still fixed by ``seed``: adding a variant to the
            # run does not change the other pairs' intervals
            pair_seed = [seed, i, cols.index(b)]
            lo, hi, p_boot = paired_bootstrap(d, n_boot, pair_seed, level)
            a_only, b_only = int((d > 0).sum()), int((d < 0).sum())
            p = mcnemar_exact(a_only, b_only) if binary else p_boot
            rows.append({
                "a": a, "b": b, "n": int(d.size),
                "mean_a": float(x.mean()) if d.size else float("nan"),
                "mean_b": float(y.mean()) if d.size else float("nan"),
                "diff": float(d.mean()) if d.size else float("nan"),
                "ci_low": lo, "ci_high": hi, "a_only": a_only, "b_only": b_only,
                "test": "mcnemar_exact" if binary else "paired_bootstrap", "p_value": p,
            })  # fmt: skip
    table = pd.DataFrame(
        rows,
        columns=["a", "b", "n", "mean_a", "mean_b", "diff", "ci_low", "ci_high",
                 "a_only", "b_only", "test", "p_value"],
    )  # fmt: skip
    table["p_adjusted"] = holm(table["p_value"]) if adjust == "holm" else table["p_value"]
    table["significant"] = (table["p_adjusted"] < level).astype(bool)
    better_a = (table["diff"] > 0) == higher
    table["winner"] = [
        (a if up else b) if sig else None
        for a, b, up, sig in zip(
            table["a"], table["b"], better_a, table["significant"], strict=True
        )
    ]
    table.attrs.update(metric=metric, level=level, adjust=adjust, binary=binary, n_boot=n_boot)
    return table


def _signed(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:+.3f}"


def decide(table: Any) -> str:
    """Sentences from a ``compare`` table: one per pair, naming a winner only where the
    difference is significant, then an overall verdict (a variant that significantly beats every
    other one, or none)."""
    if not len(table):
        return "nothing to compare: fewer than two variants"
    metric = table.attrs.get("metric", "metric")
    level = table.attrs.get("level", 0.05)
    adjusted = table.attrs.get("adjust", "holm") == "holm"
    conf = f"{100 * (1 - level):g}% CI"
    lines = []
    for row in table.itertuples(index=False):
        test = "exact McNemar" if row.test == "mcnemar_exact" else "paired bootstrap"
        p = f"{test} p={row.p_value:.3g}" + (f", Holm {row.p_adjusted:.3g}" if adjusted else "")
        stats = (
            f"{metric} {row.a} - {row.b} = {_signed(row.diff)} "
            f"({conf} {_signed(row.ci_low)} to {_signed(row.ci_high)}; {p}; "
            f"{row.n} paired questions)"
        )
        if isinstance(row.winner, str):  # None: no winner (pandas may store it as NaN)
            loser = row.b if row.winner == row.a else row.a
            lines.append(f"{row.winner} beats {loser}: {stats}")
        else:
            lines.append(f"{row.a} vs {row.b}: no significant difference at {level:g}: {stats}")
    variants = list(dict.fromkeys([*table["a"], *table["b"]]))
    wins = table["winner"].dropna().value_counts()
    best = [v for v in variants if wins.get(v, 0) == len(variants) - 1]
    if best:
        lines.append(f"=> {best[0]} is significantly better than every other variant on {metric}")
    else:
        lines.append(
            f"=> no variant is significantly better than all others on {metric} at {level:g}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- failure attribution

# Causes of a wrong answer, in the order they are checked (the first that applies wins): missing
# evidence explains everything after it, so it comes first.
CAUSES = (
    "retrieval_miss",  # RAG: no gold evidence in the retrieved context (meta gold_hit False)
    "truncated",  # long context: the overflow policy cut the evidence away (known)
    "distractor_answer",  # the answer names another key's value (RULER multikey, hard needles)
    "context_truncated",  # long context: the context was cut; whether the evidence went is unknown
    "reader_miss",  # the evidence was in the prompt and the answer is still wrong
    "no_context",  # closed book: the model was given no context
    "unattributed",  # a miss with nothing recorded to explain it (no evidence spans)
)
OUTCOMES = ("correct", *CAUSES, "error")

# RULER / multidoc needle: "One of the special magic numbers for quiet-lake is: 4817263."
_NEEDLE = re.compile(
    r"special magic [a-z]+ for (?P<key>[^\n:]+?) (?:is|are):?\s+(?P<value>[^\s,;]+?)"
    r"(?=[.,;]?(?:\s|$))",
    re.IGNORECASE,
)


def distractor_values(example: Any) -> tuple[str, ...]:
    """Values in ``example``'s context that answer some *other* key: ``meta["distractor_values"]``
    when the dataset stores it, else every keyed needle ("special magic ... for KEY is: VALUE")
    whose key is not asked (``meta["keys"]``) and whose value is not a gold answer. Covers RULER
    multikey (distractor keys and, with the needles haystack, filler needles) and multidoc."""
    meta = example.meta or {}
    if meta.get("distractor_values") is not None:
        return tuple(str(v) for v in meta["distractor_values"])
    asked = {str(k).lower() for k in meta.get("keys", ())}
    gold = {a.lower() for a in example.answers}
    found = []
    for m in _NEEDLE.finditer(example.context):
        key, value = m["key"].strip().lower(), m["value"]
        if key not in asked and value.lower() not in gold:
            found.append(value)
    return tuple(dict.fromkeys(found))


def names_value(prediction: str, values: Iterable[str]) -> bool:
    """Whether ``prediction`` contains one of ``values`` as a whole token (case-insensitive), so
    "123" is not found inside "41234"."""
    text = prediction or ""
    return any(
        re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text, re.IGNORECASE) for v in values if v
    )


def evidence_depth(example: Any) -> float:
    """Where the (first) evidence span starts in the long-context prompt's context, as a
    percentage of its characters (NaN without evidence spans)."""
    from ragbench.types import DOCUMENT_SEPARATOR

    spans = (example.meta or {}).get("evidence") or []
    if not spans:
        return float("nan")
    offsets, pos = {}, 0
    for doc in example.documents:
        head = len(doc.title) + 1 if doc.title else 0  # join_documents: "title\ntext"
        offsets[doc.id] = pos + head
        pos += head + len(doc.text) + len(DOCUMENT_SEPARATOR)
    total = max(1, pos - len(DOCUMENT_SEPARATOR))
    starts = [offsets[d] + s for d, s, _ in spans if d in offsets]
    return 100.0 * min(starts) / total if starts else float("nan")


def _cell(row: Mapping[str, Any], name: str) -> Any:
    """A row's value, None when absent or NaN (a column other strategies' rows fill)."""
    value = row.get(name)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _source(row: Mapping[str, Any]) -> str:
    """Which call produced the answer: rag, long_context, closed_book (or the strategy name).
    Self-Route's answer comes from the branch its ``route`` names."""
    strategy = row["strategy"]
    if strategy == "self_route":
        return _cell(row, "route") or "rag"
    if strategy.startswith("long_context"):  # KV-cache variants answer from the whole context
        return "long_context"
    if strategy.startswith("rag") or _cell(row, "gold_hit") is not None:
        return "rag"
    return strategy


def _cause(row: Mapping[str, Any], source: str, distractor: bool) -> str:
    lc = "lc_" if row["strategy"] == "self_route" and source == "long_context" else ""
    if source == "rag":
        hit = _cell(row, "gold_hit")
        if hit is not None and not bool(hit):
            return "retrieval_miss"
        if distractor:
            return "distractor_answer"
        return "reader_miss" if hit is not None else "unattributed"
    if source == "long_context":
        # ``evidence_truncated`` is not recorded yet (see the module's report); only the number
        # of tokens cut is, which says the context lost something, not that the evidence did
        if _cell(row, f"{lc}evidence_truncated"):
            return "truncated"
        if distractor:
            return "distractor_answer"
        if (_cell(row, f"{lc}truncated_tokens") or 0) > 0:
            return "context_truncated"
        return "reader_miss"
    if source == "closed_book":
        return "distractor_answer" if distractor else "no_context"
    return "distractor_answer" if distractor else "unattributed"


def attribute(
    df: Any,
    metric: str = "string_match_all",
    examples: Iterable[Any] | Mapping[str, Any] | None = None,
    threshold: float = 1.0,
) -> Any:
    """Why each record's answer was wrong: one row per record with ``example_id``, ``strategy``,
    ``label``, ``source`` (the call that answered: rag, long_context, closed_book; Self-Route's
    routed branch), ``score``, ``correct`` (score >= ``threshold``), ``outcome`` ("correct",
    one of ``CAUSES``, or "error"), ``distractor_named`` (the prediction names another key's
    value, whatever the cause), ``declined`` (it said "unanswerable"), ``evidence_depth``
    (percent) and ``distractors_known``.

    ``examples`` (the run's ``Example``s, a list or a dict by id) supply what the table does not
    hold: distractor values (parsed from the needles) and the evidence depth. Without them the
    depth comes from a ``depth_percent`` column (NIAH) and no answer is called a distractor.
    """
    import pandas as pd

    from ragbench.strategies.prompts import is_declined

    df = _labels(df)
    _check_metric(df, metric)
    if isinstance(examples, Mapping):
        by_id = dict(examples)
    else:
        by_id = {e.id: e for e in examples or ()}
    distractors = {i: distractor_values(e) for i, e in by_id.items()}
    depths = {i: evidence_depth(e) for i, e in by_id.items()}
    out = []
    for row in df.to_dict("records"):
        ex = row["example_id"]
        score = _cell(row, metric)
        error = _cell(row, "error")
        values = distractors.get(ex, ())
        stored = _cell(row, "distractor_values")  # a future column wins over parsing
        if stored is not None:
            # parquet keeps a list column as JSON text when pyarrow cannot type it
            values = tuple(json.loads(stored) if isinstance(stored, str) else stored)
        prediction = row.get("prediction") or ""
        named = names_value(prediction, values)
        source = _source(row)
        correct = score is not None and error is None and score >= threshold
        if error is not None or score is None:
            outcome = "error"
        elif correct:
            outcome = "correct"
        else:
            outcome = _cause(row, source, named)
        depth = depths.get(ex, float("nan"))
        if math.isnan(depth) and _cell(row, "depth_percent") is not None:
            depth = float(row["depth_percent"])
        out.append({
            "example_id": ex, "strategy": row["strategy"], "label": row["label"],
            "source": source, "score": score, "correct": bool(correct), "outcome": outcome,
            "distractor_named": bool(named), "declined": is_declined(prediction),
            "evidence_depth": depth, "distractors_known": bool(values),
        })  # fmt: skip
    table = pd.DataFrame(out)
    if len(table):
        table["outcome"] = pd.Categorical(table["outcome"], categories=OUTCOMES)
    table.attrs.update(metric=metric, threshold=threshold)
    return table


def attribution_table(records: Any) -> Any:
    """Per variant (config order): ``n`` records, ``correct``, ``misses``, one count column per
    outcome in ``CAUSES`` and ``error``, and ``mean_miss_depth`` (mean evidence depth of the
    misses, percent). ``records``: the output of ``attribute``."""
    import pandas as pd

    order = list(dict.fromkeys(records["label"]))
    counts = pd.crosstab(records["label"], records["outcome"], dropna=False)
    counts = counts.reindex(index=order, columns=list(OUTCOMES), fill_value=0)
    misses = records[~records["correct"] & (records["outcome"] != "error")]
    depth = misses.groupby("label", sort=False)["evidence_depth"].mean()
    strategy = records.drop_duplicates("label").set_index("label")["strategy"]
    table = pd.DataFrame({"strategy": strategy.reindex(order), "n": counts.sum(axis=1)})
    table["correct"] = counts["correct"]
    table["misses"] = counts[list(CAUSES)].sum(axis=1)
    table = table.join(counts[[*CAUSES, "error"]])
    table["mean_miss_depth"] = depth.reindex(order)
    return table.rename_axis("label").reset_index()


# ---------------------------------------------------------------------------- oracle router

# the per-query cost columns a summary table averages (report.summary; the oracle's rows too),
# in display order; measured KV-cache bytes when the transformers backend measured them
SUMMARY_COST_COLUMNS = (
    "prompt_tokens", "dollars", "resource_seconds", "latency_seconds", "kv_bytes_measured", "flops",
)  # fmt: skip
# cost is money, else the device time charged (resource seconds; gpu_seconds in older tables);
# never latency, which is what a user waited, not what the query cost
COST_PREFERENCE = ("dollars", "resource_seconds", "gpu_seconds")


def pick_cost(df: Any, cost: str | None = None) -> str:
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
    df: Any,
    metric: str = "string_match_all",
    cost: str | None = None,
    threshold: float = 1.0,
    labels: Iterable[str] | None = None,
) -> Any:
    """Per question, the variant an all-knowing router would send it to: the cheapest (by
    ``cost``, see ``pick_cost``) whose score reached ``threshold``; where none did, the cheapest
    of all (knowing every answer is wrong, it spends least). Candidates: ``labels``, default every
    variant except Self-Route (itself a router). Only questions every candidate answered without
    error count, so each choice is made among the same options.

    One row per question: ``example_id``, ``label`` chosen, ``correct``, the metric, the cost
    column and every summary cost column of the chosen record. ``attrs["cost"]`` names the cost.
    """
    df = _labels(df)
    _check_metric(df, metric)
    if labels is None:
        labels = [lb for lb, s in df.drop_duplicates("label")[["label", "strategy"]].values
                  if s != "self_route"]  # fmt: skip
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


def router_headroom(
    df: Any,
    metric: str = "string_match_all",
    cost: str | None = None,
    threshold: float = 1.0,
    labels: Iterable[str] | None = None,
    seed: int = 0,
) -> Any:
    """``report.summary``'s table on the questions the oracle saw, plus one ``oracle router``
    row (its accuracy with a bootstrap 95% CI and the mean cost of its choices), plus
    ``oracle_gain``: how much accuracy the oracle adds over each row. Pass it to
    ``report.plot_accuracy_vs_cost`` to put the oracle on the accuracy-cost plot."""
    import pandas as pd

    from ragbench.metrics import bootstrap_ci
    from ragbench.report import summary

    df = _labels(df)
    choices = oracle_router(df, metric, cost, threshold, labels)
    cost = choices.attrs["cost"]
    questions = set(choices["example_id"])
    with warnings.catch_warnings():  # summary's Self-Route warnings were shown with its table
        warnings.simplefilter("ignore", UserWarning)
        base = summary(df[df["example_id"].isin(questions)], metric=metric, seed=seed)
    if cost not in base.columns:  # e.g. gpu_seconds: not a summary column; add it for the plot
        ok = _scored(df[df["example_id"].isin(questions)], metric)
        base[cost] = base["label"].map(ok.groupby("label")[cost].mean())
    scores = choices[metric].to_numpy(dtype=float)
    lo, hi = bootstrap_ci(scores, seed=seed)
    oracle = {
        "label": ORACLE_LABEL, metric: float(scores.mean()) if scores.size else float("nan"),
        "ci_low": lo, "ci_high": hi, "n": int(scores.size), "n_missing": 0,
        **{c: float(choices[c].mean()) for c in base.columns if c in choices and c not in ("label", metric)},
    }  # fmt: skip
    table = pd.concat([base, pd.DataFrame([oracle])], ignore_index=True)
    table["oracle_gain"] = table.loc[table["label"] == ORACLE_LABEL, metric].iloc[0] - table[metric]
    table.attrs.update(cost=cost, metric=metric, candidates=choices.attrs["candidates"])
    return table


# ---------------------------------------------------------------------------- Self-Route


def self_route_diagnostics(
    df: Any, metric: str = "string_match_all", threshold: float = 1.0
) -> Any:
    """Per Self-Route variant: ``n`` scored queries, ``routed`` (fell back to long context after
    the model declined), ``routing_rate``, ``accuracy`` (share with score >= ``threshold``) and
    the accuracy of the ``unrouted`` (answered by RAG) and ``routed`` queries."""
    import pandas as pd

    df = _labels(df)
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
    sr = df[df["strategy"] == "self_route"]
    if sr.empty:
        return pd.DataFrame(columns=columns)
    if "route" not in sr.columns:
        raise ValueError(
            "self_route rows have no 'route' column; was the run made by ragbench.runner?"
        )
    rows = []
    for label, group in _scored(sr, metric).groupby("label", sort=False):
        routed = group["route"] == "long_context"
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
    sr = df["strategy"] == "self_route" if "strategy" in df else None
    if sr is None or not sr.any() or metric not in df or "route" not in df:
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
