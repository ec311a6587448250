"""Retrieval metrics on BEIR/TREC-shaped runs and qrels.

``run = {qid: {doc_id: score}}`` (what ``retrievers.to_run`` returns) and
``qrels = {qid: {doc_id: relevance}}``. Every metric is a pure function of one query's ranked
doc ids and its judgments; ``evaluate`` averages it over the queries of ``qrels``.

Conventions (the same as ranx, which the tests compare against to 1e-9):

- A document is relevant when its judgment is >= 1; nDCG uses the judgment as a linear gain
  (Järvelin & Kekäläinen; ranx ``ndcg``, trec_eval ``ndcg_cut``).
- Queries come from ``qrels``: a query missing from the run (an empty run) scores 0 on every
  metric; a query with no relevant document scores 0; run queries absent from qrels are ignored.
- ``metric@k`` looks at the top k; a bare name (``"mrr"``) looks at the whole ranking.
- Tie-break rule: documents are ranked by score, descending; documents with equal scores keep
  the order in which they appear in the run dict (a stable sort). ``to_run`` inserts documents in
  the retriever's rank order, so ties keep the retriever's order. ranx does the same (its numba
  argsort is a stable insertion sort for rankings of up to 15 documents; past that its quicksort
  may permute ties, so ranx itself is not tie-deterministic on longer rankings).

The math is hand-written rather than delegated to ranx on purpose: it is a few lines each, needs
no numba JIT warm-up (seconds on a cold start) and keeps ranx a test-only dependency.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ragbench.registry import unknown

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def rank(scores: Mapping[str, float]) -> list[str]:
    """Doc ids by score descending; ties keep insertion order (see the module docstring)."""
    for doc_id, score in scores.items():
        if not isinstance(score, numbers.Real) or math.isnan(score):
            raise ValueError(f"run score for {doc_id!r} must be a number, got {score!r}")
    return sorted(scores, key=lambda d: -float(scores[d]))


def _relevant(judgments: Mapping[str, int]) -> dict[str, float]:
    return {d: float(r) for d, r in judgments.items() if r >= 1}


def hit(ranked: list[str], judgments: Mapping[str, int], k: int | None) -> float:
    """1 if any relevant document is in the top k, else 0."""
    rel = _relevant(judgments)
    return float(any(d in rel for d in ranked[:k]))


def recall(ranked: list[str], judgments: Mapping[str, int], k: int | None) -> float:
    """Relevant documents in the top k over all relevant documents."""
    rel = _relevant(judgments)
    if not rel:
        return 0.0
    return sum(1 for d in ranked[:k] if d in rel) / len(rel)


def mrr(ranked: list[str], judgments: Mapping[str, int], k: int | None) -> float:
    """Reciprocal rank of the first relevant document in the top k (0 if none)."""
    rel = _relevant(judgments)
    for i, d in enumerate(ranked[:k]):
        if d in rel:
            return 1.0 / (i + 1)
    return 0.0


def ndcg(ranked: list[str], judgments: Mapping[str, int], k: int | None) -> float:
    """DCG of the top k with linear gains, over the DCG of the ideal ranking of the judgments."""
    rel = _relevant(judgments)
    if not rel:
        return 0.0
    dcg = sum(rel.get(d, 0.0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg


_FUNCTIONS: dict[str, Callable[[list[str], Mapping[str, int], int | None], float]] = {
    "hit": hit,
    "recall": recall,
    "mrr": mrr,
    "ndcg": ndcg,
}


@dataclass(frozen=True)
class RetrievalMetric:
    """A parsed metric name such as ``"ndcg@10"``; call it on one query's ranking."""

    name: str  # the full name, e.g. "ndcg@10"
    base: str  # "hit", "recall", "mrr" or "ndcg"
    k: int | None  # None: the whole ranking
    higher_is_better: bool = True
    aggregation: str = "mean"  # over the queries of the qrels

    def __call__(self, ranked: list[str], judgments: Mapping[str, int]) -> float:
        return _FUNCTIONS[self.base](ranked, judgments, self.k)


_NAME = re.compile(r"^(?P<base>[a-z_]+)(?:@(?P<k>-?\d+))?$")


def is_metric(name: str) -> bool:
    """Whether ``name`` is a retrieval metric's (``parse_metric`` takes it): a table column
    holding one reads as a rate."""
    try:
        parse_metric(name)
    except ValueError:
        return False
    return True


def parse_metric(name: str) -> RetrievalMetric:
    """``"recall@10"`` -> RetrievalMetric; unknown names list the valid ones."""
    m = _NAME.match(name.strip().lower())
    base = m.group("base") if m else name
    if base == "hit_rate":  # ranx's name for it
        base = "hit"
    if not m or base not in _FUNCTIONS:
        raise unknown("retrieval metric", name, [f"{b}@k" for b in _FUNCTIONS])
    k = int(m.group("k")) if m.group("k") is not None else None
    if k is not None and k < 1:
        raise ValueError(f"retrieval metric {name!r}: k must be >= 1")
    return RetrievalMetric(name=f"{base}@{k}" if k else base, base=base, k=k)


def check_levels(run: Run, qrels: Qrels) -> None:
    """Refuse a chunk-level run scored against document qrels: no chunk id (``"d1#0"``) equals
    a document id (``"d1"``), so every metric would be a silent 0. Detected when no ranked id is
    judged anywhere while some, stripped of their ``#n`` chunk suffix, are."""
    judged = {d for judgments in qrels.values() for d in judgments}
    ranked = {d for scores in run.values() for d in scores}
    if not ranked or ranked & judged:
        return
    as_documents = {d.rpartition("#")[0] for d in ranked if "#" in d}
    if as_documents & judged:
        example = next(iter(sorted(ranked)))
        raise ValueError(
            f"the run ranks chunk ids (e.g. {example!r}) but the qrels judge document ids: "
            "aggregate chunk scores to documents first (retrievers.to_run(..., "
            "level='document'), which keeps each document's best chunk score)"
        )


def per_query(
    run: Run, qrels: Qrels, metrics: Iterable[str] = ("recall@10",)
) -> dict[str, dict[str, float]]:
    """``{metric_name: {qid: value}}`` for every query of ``qrels``."""
    parsed = [parse_metric(m) for m in metrics]
    if not qrels:
        raise ValueError("qrels is empty: there is nothing to evaluate")
    check_levels(run, qrels)
    rankings = {qid: rank(run.get(qid, {})) for qid in qrels}
    return {
        m.name: {qid: m(rankings[qid], judgments) for qid, judgments in qrels.items()}
        for m in parsed
    }


def evaluate(
    run: Run, qrels: Qrels, metrics: Iterable[str] = ("recall@10", "mrr@10", "ndcg@10", "hit@10")
) -> dict[str, float]:
    """Mean of each metric over the queries of ``qrels`` (queries missing from the run score 0)."""
    scores = per_query(run, qrels, metrics)
    return {name: sum(values.values()) / len(values) for name, values in scores.items()}
