"""Retrieve only: build the index, rank documents for the question, score the ranking against
the example's relevance judgements. No LLM call: the retrieval half of RAG measured on its own
(BEIR datasets have qrels and no answer strings; any dataset with evidence spans works too).

Chunks are retrieved and then aggregated to documents, each scoring its best chunk (max), so
the ranking holds document ids, as qrels do (chunk ids would never match them: a silent 0).
Relevance comes from ``meta["qrels"]`` (``{doc_id: grade}``, BEIR's) or else the documents the
evidence spans name (grade 1). Scores are ``recall@k``, ``ndcg@k`` and ``mrr@k`` at each cutoff
of ``CUTOFFS`` below ``top_k`` and at ``top_k`` itself (``retrieval.metrics`` conventions).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

from ragbench.cost.accounting import Cost
from ragbench.retrieval.metrics import per_query
from ragbench.retrieval.retrievers import documents_by_max
from ragbench.strategies.base import Resources, Steps
from ragbench.strategies.params import Positive, RetrievalParams
from ragbench.types import Example, Record

CUTOFFS = (1, 5, 10)  # the standard BEIR report cutoffs, plus top_k
MEASURES = ("recall", "ndcg", "mrr")
GROWTH = 4  # chunks fetched per wanted document, grown by this factor until top_k documents


@dataclasses.dataclass(frozen=True)
class RetrieveOnlyParams(RetrievalParams):
    strategy: ClassVar[str] = "retrieve_only"

    top_k: Positive = 10  # documents ranked and scored (metrics at 1, 5, 10 and top_k)

    short: ClassVar[dict[str, str]] = {**RetrievalParams.short, "top_k": "k"}
    always: ClassVar[tuple[str, ...]] = ("top_k",)


def judgements(example: Example) -> dict[str, int]:
    """``{doc_id: grade}``: ``meta["qrels"]``, else grade 1 for each document with evidence."""
    qrels = example.meta.get("qrels")
    if isinstance(qrels, dict) and qrels:
        return {str(d): int(g) for d, g in qrels.items()}
    relevant = {doc_id: 1 for doc_id, _, _ in example.evidence}
    if not relevant:
        raise ValueError(
            f"example {example.id!r}: retrieve_only needs relevance judgements, "
            "meta['qrels'] ({doc_id: grade}) or meta['evidence'] spans; it has neither"
        )
    return relevant


def metric_names(top_k: int) -> list[str]:
    cutoffs = sorted({c for c in CUTOFFS if c < top_k} | {top_k})
    return [f"{m}@{k}" for m in MEASURES for k in cutoffs]


def rank_documents(example: Example, res: Resources, params: RetrieveOnlyParams) -> dict[str, Any]:
    """The top ``top_k`` documents ``{doc_id: best chunk score}`` and the timings."""
    if res.index is None:
        raise ValueError(
            "retrieve_only needs a retrieval index; the run has none (Resources.index)"
        )
    t0 = time.perf_counter()
    chunks, retriever = res.index(example, params.retrieval())
    t1 = time.perf_counter()
    # a document may own many of the best chunks: fetch more chunks until top_k distinct
    # documents are ranked (or every chunk is), growing geometrically (deterministic)
    n = min(len(chunks), params.top_k * GROWTH)
    while True:
        hits = retriever.retrieve([example.question], n)[0]
        docs = documents_by_max(hits)
        if len(docs) >= params.top_k or n >= len(chunks):
            break
        n = min(len(chunks), n * GROWTH)
    t2 = time.perf_counter()
    top = dict(list(docs.items())[: params.top_k])
    return {"docs": top, "chunks": n, "index_seconds": t1 - t0, "retrieve_seconds": t2 - t1}


def retrieve_only_steps(example: Example, res: Resources, params: RetrieveOnlyParams) -> Steps:
    qrels = judgements(example)
    ranked = rank_documents(example, res, params)
    run = {example.id: ranked["docs"]}
    per = per_query(run, {example.id: qrels}, metric_names(params.top_k))
    scores: dict[str, float | None] = {name: values[example.id] for name, values in per.items()}
    seconds = ranked["index_seconds"] + ranked["retrieve_seconds"]
    return Record(
        example_id=example.id,
        strategy=params.strategy,
        params=params,
        prediction="",  # nothing generated
        answers=example.answers,
        scores=scores,
        cost=Cost().with_retrieval(seconds, ranked["retrieve_seconds"]),  # no LLM call
        meta={
            "retrieved_docs": list(ranked["docs"]),
            "retrieved_chunks": ranked["chunks"],
            "relevant_docs": sorted(d for d, g in qrels.items() if g >= 1),
            "index_seconds": ranked["index_seconds"],
            "retrieve_seconds": ranked["retrieve_seconds"],
        },
    )
    yield  # unreachable; makes this a generator, the shape every strategy's steps have
