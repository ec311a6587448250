"""Answer metrics and their aggregation with bootstrap confidence intervals.

Each metric maps (prediction, gold answers) to a score in [0, 1] and declares
``higher_is_better`` and its aggregation. SQuAD exact match / token F1 reproduce the official
SQuAD v1.1 evaluation script (normalisation: lowercase, drop punctuation, drop the articles
a/an/the, collapse whitespace; maximum over the gold answers). It is copied, not imported,
because the official script is not a package; lm-evaluation-harness does the same. RULER's
``string_match_all`` / ``string_match_part`` follow RULER's ``eval/synthetic/constants.py``
(case-insensitive substring, averaged or maxed over the references).

Metrics of another ``kind`` are registered here so configs can name them, but are not computed
from (prediction, gold) alone: ``judge`` metrics (``judge_correct``, ``judge_faithful``) ask a
judge LLM and ``embedding`` metrics (``semantic_similarity``) need an embedder. ``score`` (and so
every strategy's record) computes the ``string`` metrics only; the runner's judge pass
(``ragbench.judge``) fills in the others afterwards, through the completion cache.

Normalisation (``normalize_answer``, ``NO_ANSWER``) is ``metrics.normalize``'s, re-exported here.
Retrieval metrics live in ``ragbench.retrieval.metrics``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragbench.metrics.longbench import longbench_score
from ragbench.metrics.normalize import NO_ANSWER, normalize_answer
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


def _longbench(prediction: str, answers: Sequence[str], meta: Mapping[str, Any] | None) -> float:
    return longbench_score(prediction, answers, meta)


# ---------------------------------------------------------------------------- registry


KINDS = ("string", "judge", "embedding")  # how a metric is computed (see the module docstring)


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[str, Sequence[str]], float] | None
    higher_is_better: bool = True
    aggregation: str = "mean"  # per-example scores are averaged over a group
    description: str = ""
    # the metric also reads the example's meta (``fn(prediction, answers, meta)``): metrics
    # chosen per example, such as LongBench's official metric of each subset
    needs_meta: bool = False
    kind: str = "string"  # string: fn(prediction, answers); judge/embedding: ragbench.judge

    def __call__(
        self, prediction: str, answers: Sequence[str], meta: Mapping[str, Any] | None = None
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
            Metric("exact_match", exact_match, description="SQuAD exact match, max over answers"),
            Metric("f1", f1, description="SQuAD token F1, max over answers"),
            Metric("string_match_all", string_match_all, description="RULER: share of refs found"),
            Metric("string_match_part", string_match_part, description="RULER: any ref found"),
            Metric("contains", contains, description="normalised gold answer inside prediction"),
            Metric(
                "longbench",
                _longbench,
                description="LongBench: each subset's official metric (meta['metric'])",
                needs_meta=True,
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
        )
    },
)


def get_metric(name: str) -> Metric:
    return METRICS.get(name)


def string_metrics(names: Sequence[str]) -> list[str]:
    """The names among ``names`` computed from (prediction, gold) alone, in order."""
    return [n for n in names if get_metric(n).kind == "string"]


def deferred_metrics(names: Sequence[str]) -> list[str]:
    """The names among ``names`` the judge pass fills in (judge and embedding metrics)."""
    return [n for n in names if get_metric(n).kind != "string"]


def score(
    prediction: str,
    answers: Sequence[str],
    names: Sequence[str],
    meta: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The named string metrics for one prediction; ``meta`` (the example's) is passed to the
    metrics that need it. Judge and embedding metrics are skipped: ``ragbench.judge`` scores
    them after generation. Gold answers must be non-empty.

    A question whose only gold answer is ``NO_ANSWER`` has no answer in its context (SQuAD 2.0's
    unanswerable questions; the official script's gold is "" there): a prediction that declines
    (contains the decline word the prompts ask for) scores 1 on every metric, anything else 0,
    so "Unanswerable: the text does not say" counts as declining, exactly as
    ``strategies.prompts.is_declined`` does."""
    if not answers:
        raise ValueError("cannot score an example with no gold answers")
    names = string_metrics(names)
    if tuple(answers) == (NO_ANSWER,):
        return dict.fromkeys(names, float(declined(prediction)))
    return {n: get_metric(n)(prediction, answers, meta) for n in names}


# ---------------------------------------------------------------------------- aggregation


def bootstrap_ci(
    values: Sequence[float], n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (local RNG: the same seed gives the same interval)."""
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


def aggregate(df: Any, by: Sequence[str], metric: str, n_boot: int = 1000, seed: int = 0) -> Any:
    """Mean of ``metric`` per group with a bootstrap 95% CI.

    Returns one row per group: the ``by`` columns, ``metric``, ``mean``, ``ci_low``,
    ``ci_high``, ``n`` (scored rows) and ``n_missing`` (error rows, excluded from the mean).
    """
    import pandas as pd

    by = list(by)
    missing = [c for c in [*by, metric] if c not in df.columns]
    if missing:
        raise unknown("column", missing[0], df.columns)
    rows = []
    for key, group in df.groupby(by, sort=True, dropna=False) if by else [((), df)]:
        key = key if isinstance(key, tuple) else (key,)
        values = pd.to_numeric(group[metric], errors="coerce").dropna().to_numpy()
        lo, hi = bootstrap_ci(values, n_boot=n_boot, seed=seed)
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "metric": metric,
                "mean": float(values.mean()) if values.size else float("nan"),
                "ci_low": lo,
                "ci_high": hi,
                "n": int(values.size),
                "n_missing": int(len(group) - values.size),
            }
        )
    return pd.DataFrame(rows)
