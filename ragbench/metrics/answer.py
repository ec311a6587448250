"""Answer metrics and their aggregation with confidence intervals (Wilson for 0/1 scores,
percentile bootstrap for continuous ones).

Each metric maps (prediction, gold answers) to a score in [0, 1] and declares
``higher_is_better`` and its aggregation. SQuAD exact match / token F1 reproduce the official
SQuAD v1.1 evaluation script (normalisation: lowercase, drop punctuation, drop the articles
a/an/the, collapse whitespace; maximum over the gold answers). It is copied, not imported,
because the official script is not a package; lm-evaluation-harness does the same. RULER's
``string_match_all`` / ``string_match_part`` follow RULER's ``eval/synthetic/constants.py``
(case-insensitive substring, averaged or maxed over the references). SQuAD 2.0 questions are
scored by the official v2.0 script's rules (``metrics.squad``; ``score`` dispatches on the
example's meta). Every metric has a ``version`` (``metric_versions``) for the run's manifest.

Metrics of another ``kind`` are registered here so configs can name them, but are not computed
from (prediction, gold) alone: ``judge`` metrics (``judge_correct``, ``judge_faithful``) ask a
judge LLM and ``embedding`` metrics (``semantic_similarity``) need an embedder. ``score`` (and so
every strategy's record) computes the ``string`` metrics only; the runner's judge pass
(``ragbench.judge``) fills in the others afterwards, through the completion cache (the ``noise``
kind: ``ragbench.experiment.noise_pass``, answering again with distractor documents added).

Normalisation (``normalize_answer``, ``NO_ANSWER``) is ``metrics.normalize``'s.
Retrieval metrics live in ``ragbench.retrieval.metrics``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ragbench.metrics.longbench import longbench_score
from ragbench.metrics.longbench import meta_problem as longbench_meta_problem
from ragbench.metrics.longbench_v2 import longbench_v2_accuracy
from ragbench.metrics.normalize import NO_ANSWER, normalize_answer
from ragbench.metrics.squad import (
    as_squad_prediction,
    exact,
    gold_answers,
    has_answer,
    is_squad_v2,
    squad_v2_scores,
)
from ragbench.registry import Registry, unknown

# ---------------------------------------------------------------------------- SQuAD (official)


def _em_one(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1_one(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    return max((_em_one(prediction, a) for a in answers), default=0.0)


def f1(prediction: str, answers: Sequence[str]) -> float:
    return max((_f1_one(prediction, a) for a in answers), default=0.0)


# ---------------------------------------------------------------------------- RULER and contains


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """Fraction of the references found in the prediction (RULER: niah multi-value, vt, cwe)."""
    if not answers:
        return 0.0
    p = prediction.lower()
    return sum(a.lower() in p for a in answers) / len(answers)


def string_match_part(prediction: str, answers: Sequence[str]) -> float:
    """1 if any reference is found in the prediction (RULER: qa tasks)."""
    p = prediction.lower()
    return float(any(a.lower() in p for a in answers))


def contains(prediction: str, answers: Sequence[str]) -> float:
    """1 if any normalised gold answer appears in the normalised prediction (lenient QA match)."""
    p = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(a) and f" {normalize_answer(a)} " in p for a in answers))


# ---------------------------------------------------------------------------- no answer


def declined(prediction: str) -> bool:
    """The prediction declines to answer (``strategies.prompts.is_declined``)."""
    return NO_ANSWER in prediction.lower()


def _longbench(prediction: str, answers: Sequence[str], meta: Mapping[str, object] | None) -> float:
    return longbench_score(prediction, answers, meta)


# ---------------------------------------------------------------------------- registry


KINDS = ("string", "judge", "embedding", "noise")  # how a metric is computed (module docstring)


@dataclass(frozen=True)
class Metric:
    name: str
    # (prediction, answers) -> score; (prediction, answers, meta) with ``needs_meta``
    fn: Callable[..., float] | None
    higher_is_better: bool = True
    aggregation: str = "mean"  # per-example scores are averaged over a group
    description: str = ""
    # the metric also reads the example's meta (``fn(prediction, answers, meta)``): metrics
    # chosen per example, such as LongBench's official metric of each subset
    needs_meta: bool = False
    # for such a metric: why an example's meta cannot be scored (None: it can), so a run
    # refuses a dataset it cannot score before it starts, rather than failing every record
    meta_problem: Callable[[Mapping[str, object] | None], str | None] | None = None
    kind: str = "string"  # string: fn(prediction, answers); judge/embedding: ragbench.judge
    # bumped whenever the metric's scores change, so a manifest says which scoring made a table
    # (2: SQuAD 2.0 scored as the official v2.0 script; LongBench ROUGE-L from `rouge` 1.0.1)
    version: int = 1

    def __call__(
        self, prediction: str, answers: Sequence[str], meta: Mapping[str, object] | None = None
    ) -> float:
        if self.fn is None:
            raise TypeError(
                f"metric {self.name!r} ({self.kind}) is not computed from a prediction alone; "
                "the runner's judge pass scores it (ragbench.judge.judge_records)"
            )
        if self.needs_meta:
            return float(self.fn(prediction, answers, meta))
        return float(self.fn(prediction, answers))


METRICS = Registry(
    "metric",
    {
        m.name: m
        for m in (
            Metric(
                "exact_match",
                exact_match,
                description="SQuAD exact match, max over answers",
                version=2,
            ),
            Metric("f1", f1, description="SQuAD token F1, max over answers", version=2),
            Metric(
                "string_match_all",
                string_match_all,
                description="RULER: share of refs found",
                version=2,
            ),
            Metric(
                "string_match_part",
                string_match_part,
                description="RULER: any ref found",
                version=2,
            ),
            Metric(
                "contains",
                contains,
                description="normalised gold answer inside prediction",
                version=2,
            ),
            Metric(
                "longbench",
                _longbench,
                description="LongBench: each subset's official metric (meta['metric'])",
                needs_meta=True,
                meta_problem=longbench_meta_problem,
                version=2,
            ),
            Metric(
                "longbench_v2_accuracy",
                longbench_v2_accuracy,
                description="LongBench v2: the letter pred.py extracts equals the gold letter",
            ),
            # scored after generation by ragbench.judge (a judge LLM / an embedder); a score is
            # None (NaN in the table) when the judge's reply could not be parsed, never 0
            Metric(
                "judge_correct",
                None,
                kind="judge",
                description="judge LLM: the answer means the same as a gold answer (0/1, mean "
                "over judge samples)",
            ),
            Metric(
                "judge_faithful",
                None,
                kind="judge",
                description="judge LLM: the answer is supported by the context the strategy "
                "gave the model (0/1, mean over judge samples)",
            ),
            Metric(
                "semantic_similarity",
                None,
                kind="embedding",
                description="cosine of prediction and gold embeddings, max over answers, "
                "clipped at 0",
            ),
            # RAGAS's context metrics (ragbench.judge.context_metrics), judge LLM calls per
            # retrieved context / reference statement / generated question
            Metric(
                "context_precision",
                None,
                kind="judge",
                description="judge LLM (RAGAS): average precision of the retrieved contexts, "
                "each judged useful or not for reaching the gold answer, in rank order",
            ),
            Metric(
                "context_recall",
                None,
                kind="judge",
                description="judge LLM (RAGAS): share of the gold answer's statements the "
                "retrieved contexts support",
            ),
            Metric(
                "answer_relevancy",
                None,
                kind="judge",
                description="judge LLM + embedder (RAGAS): mean cosine of the question and "
                "questions the judge writes from the answer; 0 if it finds the answer evasive",
            ),
            Metric(
                "noise_sensitivity",
                None,
                higher_is_better=False,
                kind="noise",  # experiment/noise_pass.py, after generation and the judge pass
                description="first answer metric: clean corpus minus distractors added",
            ),
        )
    },
)


def get_metric(name: str) -> Metric:
    return METRICS.get(name)


def metric_versions(names: Sequence[str]) -> dict[str, int]:
    """``{name: version}`` of the named metrics, for a run's manifest."""
    return {n: get_metric(n).version for n in names}


def string_metrics(names: Sequence[str]) -> list[str]:
    """The names among ``names`` computed from (prediction, gold) alone, in order."""
    return [n for n in names if get_metric(n).kind == "string"]


def deferred_metrics(names: Sequence[str]) -> list[str]:
    """The names among ``names`` the judge pass fills in (judge and embedding metrics)."""
    return [n for n in names if get_metric(n).kind not in ("string", "noise")]


def score(
    prediction: str,
    answers: Sequence[str],
    names: Sequence[str],
    meta: Mapping[str, object] | None = None,
) -> dict[str, float]:
    """The named string metrics for one prediction; ``meta`` (the example's) is passed to the
    metrics that need it. Judge and embedding metrics are skipped: ``ragbench.judge`` scores
    them after generation. Gold answers must be non-empty.

    A SQuAD 2.0 question (``metrics.squad.is_squad_v2(meta)``) is scored as the official v2.0
    script scores it: the decline word ``NO_ANSWER`` is read as the empty answer, gold texts that
    normalise to nothing are dropped, and a question left with no gold (an unanswerable one, by
    ``meta["unanswerable"]``) scores 1 on every metric when the prediction is empty or declines,
    else 0. Other questions are scored literally, a gold "unanswerable" included."""
    if not answers:
        raise ValueError("cannot score an example with no gold answers")
    names = string_metrics(names)
    if meta is not None and is_squad_v2(meta):
        prediction = as_squad_prediction(prediction)
        golds = gold_answers(answers, has_answer(meta))
        if golds == [""]:  # nothing to find: every metric asks whether it declined
            return dict.fromkeys(names, exact(prediction, ""))
        official = squad_v2_scores(prediction, golds, True)
        return {
            n: official[n] if n in official else get_metric(n)(prediction, golds, meta)
            for n in names
        }
    return {n: get_metric(n)(prediction, answers, meta) for n in names}


# ---------------------------------------------------------------------------- aggregation

CI_METHODS = ("wilson", "bootstrap")  # aggregate's ``ci_method`` column


def wilson_ci(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion of ``successes`` out of ``n`` (NaN when n = 0).

    Unlike a percentile bootstrap it stays honest at small n: 4 of 4 correct gives
    [51%, 100%], not [100%, 100%]. Matches ``scipy.stats.binomtest(k, n).proportion_ci(level,
    method="wilson")``; the bounds are exactly 0 at k = 0 and 1 at k = n."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return (float("nan"), float("nan"))
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p, z2 = successes / n, z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo = 0.0 if successes == 0 else max(0.0, center - half)
    hi = 1.0 if successes == n else min(1.0, center + half)
    return (lo, hi)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (local RNG: the same seed gives the same interval).

    For continuous scores (F1, RULER's share of references found); it is too narrow on few
    questions, and on 0/1 scores ``wilson_ci`` is the right interval (``mean_ci`` chooses)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return (float("nan"), float("nan"))
    if v.size == 1 or n_boot < 1:
        return (float(v[0]), float(v[0])) if v.size == 1 else (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def is_binary(values: Sequence[float] | np.ndarray) -> bool:
    """Every value is 0 or 1 (NaN ignored): a proportion, whose interval is Wilson's."""
    v = np.asarray(values, dtype=float)
    return bool(np.isin(v[~np.isnan(v)], (0.0, 1.0)).all())


def mean_ci(
    values: ArrayLike,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    method: str | None = None,
) -> tuple[float, float, str]:
    """(ci_low, ci_high, method) for the mean of ``values``: ``wilson_ci`` when every value is
    0 or 1, else ``bootstrap_ci``; ``method`` forces one of ``CI_METHODS``."""
    v = np.asarray(values, dtype=float)
    method = method or ("wilson" if is_binary(v) else "bootstrap")
    if method == "wilson":
        return (*wilson_ci(int(v.sum()), int(v.size), level), method)
    if method == "bootstrap":
        return (*bootstrap_ci(v, n_boot=n_boot, seed=seed, level=level), method)
    raise unknown("interval method", method, CI_METHODS)


def aggregate(df: Any, by: Sequence[str], metric: str, n_boot: int = 1000, seed: int = 0) -> Any:
    """Mean of ``metric`` per group with a 95% CI.

    Returns one row per group: the ``by`` columns, ``metric``, ``mean``, ``ci_low``,
    ``ci_high``, ``ci_method``, ``n`` (scored rows) and ``n_missing`` (error rows, excluded from
    the mean). The method is chosen once for the whole column, so every group of a table gets
    the same kind of interval: ``wilson`` (Wilson score interval) when every scored value is 0
    or 1 (and the metric is a proportion), else ``bootstrap`` (percentile, ``n_boot`` resamples).
    """
    import pandas as pd

    by = list(by)
    missing = [c for c in [*by, metric] if c not in df.columns]
    if missing:
        raise unknown("column", missing[0], df.columns)
    # a difference of scores (noise_sensitivity: clean minus noisy) is no proportion even when
    # every value seen is 0 or 1: it can be negative, and Wilson's bounds cannot
    proportion = metric not in METRICS or get_metric(metric).kind != "noise"
    binary = is_binary(pd.to_numeric(df[metric], errors="coerce"))
    method = "wilson" if proportion and binary else "bootstrap"
    rows = []
    for key, group in df.groupby(by, sort=True, dropna=False) if by else [((), df)]:
        key = key if isinstance(key, tuple) else (key,)
        values = pd.to_numeric(group[metric], errors="coerce").dropna().to_numpy()
        lo, hi, _ = mean_ci(values, n_boot=n_boot, seed=seed, method=method)
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "metric": metric,
                "mean": float(values.mean()) if values.size else float("nan"),
                "ci_low": lo,
                "ci_high": hi,
                "ci_method": method,
                "n": int(values.size),
                "n_missing": int(len(group) - values.size),
            }
        )
    return pd.DataFrame(rows)
