"""RAG: retrieve, assemble within a token budget and/or top-k, in score or document order, then
answer in the example's prompt format (ragbench's: the long-context layout around the chunks).
Records chunk ids and gold hits."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ragbench.cost.accounting import Cost
from ragbench.retrieval.chunking import gold_chunk_ids
from ragbench.retrieval.context import AssembledContext, assemble_context
from ragbench.strategies.base import Resources, Steps, answer, make_record
from ragbench.strategies.params import RagParams
from ragbench.strategies.prompt_format import CITE_MARKER, RETRIEVED, Frame, prompt_format
from ragbench.types import Chunk, Example, ScoredChunk

MAX_CANDIDATES = 200  # chunks retrieved when only a token budget limits the context
# a RAG prompt bounded before any index exists (``rag_context_bound``): chunk_size counts the
# chunking tokenizer's tokens, which may be fewer than the model's (whitespace counts words,
# about 1.3 BPE tokens each in prose), so each chunk is allowed this many times its size ...
CHUNK_TOKEN_FACTOR = 2
CHUNK_MARKUP_TOKENS = 8  # ... and its marker ("[3] ", "Retrieved chunk 3: ") and separator
# a record's chunk texts on their way to the run folder's chunks.jsonl: {ref: [doc_id, text]};
# the folder's writer takes them out of the record (experiment.evidence), no table holds them
CHUNK_TEXTS = "chunk_texts"


def rag_context_bound(params: RagParams) -> int:
    """The most context tokens (the model's) a RAG prompt of ``params`` holds, its frame and
    question apart: ``top_k`` chunks of ``chunk_size`` tokens of the chunking tokenizer, each
    counted ``CHUNK_TOKEN_FACTOR`` times with its markup (the chunking tokenizer may differ from
    the model's), and at most ``budget`` (assembly counts the model's tokens exactly). What the
    run's calibration probes to (``resources.longest_prompt``): reading a handful of chunks,
    a RAG run need not time prefills as long as its haystack. A bound, not a limit: text much
    denser than the factor (digits, code) can pass it, and is priced by the fit beyond its
    probes."""
    caps = [params.budget] if params.budget is not None else []
    if params.top_k is not None:
        caps.append(params.top_k * (CHUNK_TOKEN_FACTOR * params.chunk_size + CHUNK_MARKUP_TOKENS))
    return min(caps)  # RagParams has top_k, budget or both


def fit_chunks(
    scored: Sequence[ScoredChunk],
    res: Resources,
    frame: Frame,
    cap: int,
    new_tokens: int | None = None,
    **assemble: Any,
) -> AssembledContext:
    """The best of ``scored`` assembled within ``cap`` tokens (``assemble_context`` with
    ``assemble``), then cut until ``frame`` around them fits the window: as in
    ``long_context_prompt``, the joined prompt can count more than its parts. RAG and the
    pipeline's retriever path read their chunks through this one loop."""
    ctx = assemble_context(scored, res.llm.count_tokens, cap, **assemble)
    while ctx.chunk_ids and (excess := res.excess(ctx.text, frame, new_tokens)) > 0:
        cap -= excess
        ctx = assemble_context(scored, res.llm.count_tokens, cap, **assemble)
    return ctx


def chunk_ref(chunk: Chunk) -> str:
    """A chunk's id in ``chunks.jsonl``: the same document id and text give the same ref in every
    index, run and machine (16 hex digits of SHA-256)."""
    return hashlib.sha256(f"{chunk.doc_id}\0{chunk.text}".encode()).hexdigest()[:16]


def chunk_evidence(
    chunks: Iterable[Chunk], retrieved: list[str], scores: dict[str, float], gold: list[str]
) -> dict[str, object]:
    """The meta a retrieving call adds for its view: the refs and scores of its retrieved chunks
    (in the order of ``retrieved``), the refs of its gold chunks (in the order of ``gold``), and
    their texts (``CHUNK_TEXTS``, which the run's writer moves to ``chunks.jsonl``)."""
    wanted = set(retrieved) | set(gold)
    by_id = {c.id: c for c in chunks if c.id in wanted}
    refs = {i: chunk_ref(c) for i, c in by_id.items()}
    return {
        "retrieved_refs": [refs.get(i) for i in retrieved],
        "retrieved_scores": [scores.get(i) for i in retrieved],
        "gold_refs": [refs.get(i) for i in gold],
        CHUNK_TEXTS: {refs[i]: [c.doc_id, c.text] for i, c in by_id.items()},
    }


def rag_prompt(
    example: Example, res: Resources, params: RagParams, decline: bool = False
) -> tuple[str, dict[str, object]]:
    """(prompt, meta): retrieve, assemble within the budget (and the limit), ask, in the
    example's prompt format (``params.cot``: its reasoning call's prompt and budget)."""
    if res.index is None:
        raise ValueError("rag needs a retrieval index; the run has none (Resources.index)")
    cot = getattr(params, "cot", False)
    fmt = prompt_format(example)
    frame = fmt.frame(example, RETRIEVED, decline, cot)
    new_tokens = res.new_tokens(fmt, cot)
    t0 = time.perf_counter()
    chunks, retriever = res.index(example, params.retrieval())
    t1 = time.perf_counter()
    k = min(len(chunks), params.top_k or MAX_CANDIDATES)
    scored = retriever.retrieve([example.question], k)[0]
    t2 = time.perf_counter()
    available = res.room(frame, new_tokens)
    cap = min(params.budget, available) if params.budget else available
    doc_order = [d.id for d in example.documents]
    marker = fmt.chunk_marker or CITE_MARKER  # a format with its own marker marks every chunk

    ctx = fit_chunks(
        scored,
        res,
        frame,
        cap,
        new_tokens,
        top_k=params.top_k,
        order=params.order,
        cite=params.cite or fmt.chunk_marker is not None,
        doc_order=doc_order,
        marker=marker,
    )
    gold = gold_chunk_ids(chunks, example.evidence) if example.evidence else set()
    retrieved, gold_ids = list(ctx.chunk_ids), sorted(gold)
    meta = {
        "retrieved": retrieved,
        "gold_chunks": gold_ids,
        "gold_hit": bool(gold & set(ctx.chunk_ids)) if gold else None,
        # what the view shows: the chunks' refs, scores and texts (experiment.evidence)
        **chunk_evidence(chunks, retrieved, {s.chunk.id: s.score for s in scored}, gold_ids),
        "rag_context_tokens": ctx.tokens,
        "dropped_chunks": len(ctx.dropped),
        "index_seconds": t1 - t0,
        "retrieve_seconds": t2 - t1,
    }
    return frame.prompt(ctx.text), meta


def retrieval_seconds(meta: dict[str, Any]) -> float:
    """Index build (or lookup of the run's memoised index) + this query's search."""
    return meta["index_seconds"] + meta["retrieve_seconds"]


def with_retrieval(cost: Cost, meta: dict[str, Any]) -> Cost:
    """``cost`` with its retrieval: all of it in ``retrieval_seconds``, the search (what its user
    waits for; the index is built once per document or corpus) in its latency too."""
    return cost.with_retrieval(retrieval_seconds(meta), meta["retrieve_seconds"])


def rag_steps(example: Example, res: Resources, params: RagParams) -> Steps:
    prompt, meta = rag_prompt(example, res, params)
    fmt = prompt_format(example)
    request = res.request(prompt, rid=f"{example.id}:rag", fmt=fmt, reasoning=params.cot)
    completion, cost, more = yield from answer(example, res, request, params.cot)
    cost = with_retrieval(cost, meta)
    return make_record(example, params, completion, res, meta | more, cost)
