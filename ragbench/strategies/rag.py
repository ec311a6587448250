"""RAG: retrieve, assemble within a token budget and/or top-k, in score or document order, then
answer with the same template as long context. Records chunk ids and gold hits."""

from __future__ import annotations

import time
from typing import Any

from ragbench.retrieval.chunking import gold_chunk_ids
from ragbench.retrieval.context import assemble_context
from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.params import RagParams
from ragbench.strategies.prompts import CONTEXT_TEMPLATE, question_part
from ragbench.types import Example

MAX_CANDIDATES = 200  # chunks retrieved when only a token budget limits the context


def rag_prompt(
    example: Example, res: Resources, params: RagParams, decline: bool = False
) -> tuple[str, dict[str, Any]]:
    """(prompt, meta): retrieve, assemble within the budget (and the limit), ask."""
    if res.index is None:
        raise ValueError("rag needs a retrieval index; the run has none (Resources.index)")
    tail = question_part(example, decline)
    t0 = time.perf_counter()
    chunks, retriever = res.index(example, params.retrieval())
    t1 = time.perf_counter()
    k = min(len(chunks), params.top_k or MAX_CANDIDATES)
    scored = retriever.retrieve([example.question], k)[0]
    t2 = time.perf_counter()
    available = res.room(tail)
    cap = min(params.budget, available) if params.budget else available
    doc_order = [d.id for d in example.documents]

    def assemble(cap: int):
        return assemble_context(
            scored, res.llm.count_tokens, cap, params.top_k, params.order,
            cite=params.cite, doc_order=doc_order,
        )  # fmt: skip

    ctx = assemble(cap)
    # as in long_context_prompt: the joined prompt can count more than its parts
    while ctx.chunk_ids and (excess := res.excess(ctx.text, tail)) > 0:
        cap -= excess
        ctx = assemble(cap)
    gold = gold_chunk_ids(chunks, example.evidence) if example.evidence else set()
    meta = {
        "retrieved": list(ctx.chunk_ids),
        "gold_chunks": sorted(gold),
        "gold_hit": bool(gold & set(ctx.chunk_ids)) if gold else None,
        "rag_context_tokens": ctx.tokens,
        "dropped_chunks": len(ctx.dropped),
        "index_seconds": t1 - t0,
        "retrieve_seconds": t2 - t1,
    }
    return CONTEXT_TEMPLATE.format(context=ctx.text) + tail, meta


def retrieval_seconds(meta: dict[str, Any]) -> float:
    return meta["index_seconds"] + meta["retrieve_seconds"]


def rag_steps(example: Example, res: Resources, params: RagParams) -> Steps:
    prompt, meta = rag_prompt(example, res, params)
    completion = yield res.request(prompt, rid=f"{example.id}:rag")
    cost = res.cost(completion).with_retrieval(retrieval_seconds(meta))
    return make_record(example, params, completion, res, meta, cost)
