"""Pipeline: your own system under test, scored beside closed book, long context and RAG on the
same examples and metrics.

Three kinds (``PipelineParams``): a Python callable ``target: "module:function"`` called as
``fn(question, example_id, corpus)`` (as many of those as it takes; ``corpus`` is the shared
corpus' fingerprint or None); a llama-index ``QueryEngine`` or ``BaseRetriever`` that
``target: "module:attr"`` names (or a no-argument factory returning one; built once); an HTTP
endpoint ``url`` (``pipeline_http``). A callable or endpoint answers with a string or a
``PipelineAnswer`` (or a dict / object with its fields); a query engine with its response and
source nodes; a retriever with nodes only: the run's model then reads them with the RAG prompt,
so the comparison is of retrieval alone.

The answer of a callable, query engine or endpoint is scored whole (trimmed; ``meta["raw"]`` as
it came), not read as ragbench's one-line answer (a retriever's contexts are read by the run's
model with ragbench's prompt, so that answer is). Each record keeps the contexts (ids, document
ids, spans, texts cut to ``MAX_CONTEXT_CHARS``), ``gold_hit`` against the evidence spans, and,
where the example has relevance judgements, the ranking metrics of ``retrieve_only`` (``hit``,
``recall``, ``mrr``, ``ndcg`` at 1, 5, 10 over the contexts' documents in their order; a context
with another document id is found by its text, ``_located``; one found in no document makes
them None, with a ``retrieval_note``). Cost: the reported usage priced by the run's price sheet;
without usage, the contexts + question (prompt) and the answer (completion) counted with the
run's tokenizer, ``usage_estimated``. Latency: the wall time of the call. A call that raises,
times out or answers out of contract is an error row (``MalformedAnswer`` names the field). An
answer longer than ``MAX_ANSWER_CHARS`` is stored (and scored) cut there, ending in a
``[truncated by ragbench: ...]`` marker, with its full length in meta ``answer_truncated``.

The same documents on both sides (``setup`` / ``setup_url``): before a question, the setup hook
receives its corpus, ``setup(documents, corpus)`` (or ``setup(documents)``): the example's
``Document``s (id, text, title, meta) and the corpus id (a shared corpus' fingerprint, else the
sha256 of the example's documents), which the question's call then gets as ``corpus``. It is
called when the corpus differs from the one this hook last received in the process: once for a
shared corpus, once per example for per-example documents (multidoc, RULER: each question has
its own documents, as long context reads them; pooling every example's documents into one
index would make the others distractors, which is what ``noise_sensitivity`` measures, apart).
Calls are sequential (``run_batch`` advances one item at a time), so a pipeline may keep one
index and rebuild it on each call, or keep one per corpus id. A setup that raises is an error row
(the next question on that corpus tries it again). Records say ``pipeline_index``: ``"ragbench
corpus"`` with a setup hook, ``"own index"`` without one (the verdict's conditions name such a
pipeline).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import ragbench.strategies.pipeline.http as pipeline_http
import ragbench.strategies.pipeline.target as pipeline_target
from ragbench.cost.accounting import Cost
from ragbench.datasets.corpus.cleaning import clean_text
from ragbench.datasets.corpus.file import corpus_fingerprint
from ragbench.retrieval.metrics import per_query
from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.pipeline.answer import (
    Context,
    MalformedAnswer,
    PipelineAnswer,
    Usage,
    shown,
)
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.strategies.prompt_format import CITE_MARKER, RETRIEVED, prompt_format
from ragbench.strategies.rag import fit_chunks
from ragbench.strategies.retrieve_only import judgements
from ragbench.types import Chunk, Completion, Example, Record, ScoredChunk

MAX_CONTEXTS = 50  # contexts kept per record
MAX_CONTEXT_CHARS = 4000  # characters kept per context text
# characters of an answer kept (prediction, meta.raw; scored as kept): a 50 MB answer was stored
# whole, twice per record. Its tokens are counted on the whole answer.
MAX_ANSWER_CHARS = 100_000
CUTOFFS = (1, 5, 10)
MEASURES = ("hit", "recall", "mrr", "ndcg")


# ---------------------------------------------------------------------------- the system


@dataclass(frozen=True)
class Opened:
    """A resolved pipeline: ``kind`` is function | query_engine | retriever | http."""

    kind: str
    obj: Any = None
    arity: int = 0  # function: how many of (question, example_id, corpus) it takes


_opened: dict[tuple, Opened] = {}
_open_lock = threading.Lock()


def _llama_kind(obj: object) -> str | None:
    if "llama_index.core" not in sys.modules:  # a llama-index object implies it is imported
        return None
    from llama_index.core.base.base_query_engine import BaseQueryEngine  # lazy: llama-index
    from llama_index.core.base.base_retriever import BaseRetriever

    if isinstance(obj, BaseQueryEngine):
        return "query_engine"
    return "retriever" if isinstance(obj, BaseRetriever) else None


def _arity(fn: Any) -> int | None:
    """Positional arguments ``fn`` takes, up to 3 (None: not inspectable)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 3
    return min(3, sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params))


def _build(factory: Any, target: str) -> Any:
    """What the no-argument ``factory`` returns; a factory that raises is bad input (a
    ValueError naming it and the error's last line), not a traceback."""
    try:
        return factory()
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = f": {lines[-1]}" if lines else ""
        raise ValueError(
            f"pipeline: target {target!r}: its factory {target.partition(':')[2]}() raised "
            f"{type(exc).__name__}{said}"
        ) from None


def _classify(obj: object, target: str, factory_ok: bool = True) -> Opened:
    kind = _llama_kind(obj)
    if kind:
        return Opened(kind, obj)
    if callable(obj):
        arity = _arity(obj)
        if arity == 0 and factory_ok:  # a factory: build once, then classify what it returns
            return _classify(_build(obj, target), target, factory_ok=False)
        if arity:
            return Opened("function", obj, arity)
    raise ValueError(
        f"pipeline target {target!r} is {shown(obj)}: expected a function of (question, "
        "example_id, corpus), a llama-index QueryEngine or BaseRetriever, or a no-argument "
        "factory returning one"
    )


def open_pipeline(params: PipelineParams) -> Opened:
    """The pipeline ``params`` name, resolved once per identity (a changed one is reloaded)."""
    if params.url is not None:
        return Opened("http")
    key = (params.target, params.version)
    assert params.target is not None  # PipelineParams: a url or a target
    with _open_lock:
        if key not in _opened:
            obj, _ = pipeline_target.resolve(params.target)
            _opened[key] = _classify(obj, params.target)
        return _opened[key]


OWN_INDEX, RUN_CORPUS = "own index", "ragbench corpus"  # a record's ``pipeline_index``
_set_up: dict[tuple, str] = {}  # setup hook -> the corpus id it last received (and indexed)
_setup_lock = threading.Lock()


def corpus_id(example: Example) -> str:
    """A shared corpus' fingerprint, else the sha256 of the example's own documents."""
    return example.meta.get("corpus_fingerprint") or corpus_fingerprint(example.documents)


def set_up(params: PipelineParams, example: Example) -> str | None:
    """Hand the example's corpus to the setup hook unless it holds it already (module
    docstring); the corpus id, or None without a hook. A setup that fails raises (an error row)
    and is tried again by the next question on that corpus, or by a resumed run."""
    if not params.indexes_corpus:
        return None
    corpus = corpus_id(example)
    hook = (
        ("url", params.raw_setup_url) if params.setup_url else (params.setup, params.setup_version)
    )
    with _setup_lock:
        if _set_up.get(hook) == corpus:
            return corpus
        _set_up.pop(hook, None)  # what it holds now is unknown until this setup returns
        docs = list(example.documents)
        try:
            if params.setup_url is not None:
                pipeline_http.post_setup(params, corpus, docs)
            else:
                assert params.setup is not None  # indexes_corpus: a setup_url or a setup
                fn, _ = pipeline_target.resolve(params.setup, "pipeline setup")
                fn(*(docs, corpus)[: _arity(fn) or 1])
        except Exception as exc:
            raise RuntimeError(
                f"pipeline setup {params.setup or params.setup_url!r} failed on corpus "
                f"{corpus[:12]} ({len(docs)} documents): {type(exc).__name__}: {exc}"
            ) from None
        _set_up[hook] = corpus
    return corpus


def preflight(params: PipelineParams) -> None:
    """Before any work: an endpoint answers (``pipeline_http.check``) and its header variables
    are set; a target imports and classifies (its factory built)."""
    if params.url is not None:
        pipeline_http.check(params)
    else:
        open_pipeline(params)


def _node_context(n: Any) -> Context:
    node = getattr(n, "node", n)
    meta = getattr(node, "metadata", None) or {}
    doc_id = meta.get("doc_id") or getattr(node, "ref_doc_id", None)
    start, end = getattr(node, "start_char_idx", None), getattr(node, "end_char_idx", None)
    score = getattr(n, "score", None)
    return Context(
        text=node.get_content(),
        doc_id=None if doc_id is None else str(doc_id),
        id=getattr(node, "node_id", None),
        span=(int(start), int(end)) if start is not None and end is not None else None,
        score=None if score is None else float(score),
    )


def _token_counter(engine: object) -> Any:
    """A llama-index ``TokenCountingHandler`` the user attached (engine, else Settings)."""
    from llama_index.core import Settings  # lazy: llama-index
    from llama_index.core.callbacks import TokenCountingHandler

    for manager in (getattr(engine, "callback_manager", None), Settings.callback_manager):
        for handler in getattr(manager, "handlers", None) or ():
            if isinstance(handler, TokenCountingHandler):
                return handler
    return None


def _query(engine: Any, question: str) -> PipelineAnswer:
    counter = _token_counter(engine)
    before = (
        (counter.prompt_llm_token_count, counter.completion_llm_token_count) if counter else (0, 0)
    )
    response = engine.query(question)
    usage = None
    if counter is not None and counter.llm_token_counts:
        usage = Usage(
            prompt_tokens=counter.prompt_llm_token_count - before[0],
            completion_tokens=counter.completion_llm_token_count - before[1],
        )
    text = getattr(response, "response", None)
    nodes = getattr(response, "source_nodes", None)  # None: a response without sources
    contexts = None if nodes is None else tuple(_node_context(n) for n in nodes)
    return PipelineAnswer("" if text is None else str(text), contexts, usage)


# ---------------------------------------------------------------------------- the record


def _span(needle: str, text: str) -> tuple[int, int] | None:
    """Where ``needle``'s words lie in ``text`` with any whitespace between them (a CRLF, a
    run of spaces or a line break where the other reader put one space), or None."""
    words = needle.split()
    if not words:
        return None
    found = re.search(r"\s+".join(map(re.escape, words)), text)
    return found.span() if found else None


def _located(context: Context, example: Example) -> Context:
    """A context whose document id is not one of the example's (none, or the pipeline's own ids:
    llama-index's readers make up uuids) gets the first document holding its text, and the span:
    the text as it is, else its words with any whitespace between them, else its words once
    cleaned as ragbench's corpus is (``clean_text``: line breaks, control characters, mojibake,
    NFC). A text found nowhere keeps what the pipeline said (``unlocated``)."""
    ids = {d.id for d in example.documents}
    if not context.text.strip() or context.doc_id in ids:
        return context
    needle = context.text.strip()
    for doc in example.documents:
        at = doc.text.find(needle)
        if at >= 0:
            return dataclasses.replace(context, doc_id=doc.id, span=(at, at + len(needle)))
    cleaned = clean_text(needle)
    for candidate in dict.fromkeys((needle, cleaned)):  # the cleaned words, if they differ
        for doc in example.documents:
            span = _span(candidate, doc.text)
            if span is not None:
                return dataclasses.replace(context, doc_id=doc.id, span=span)
    return context


def unlocated(contexts: list[Context], example: Example) -> int:
    """How many of ``contexts`` name no document of the example (after ``_located``)."""
    ids = {d.id for d in example.documents}
    return sum(c.doc_id not in ids for c in contexts)


def _gold_hit(contexts: list[Context], example: Example) -> bool | None:
    """Whether a context holds an evidence span (overlapping it, or containing its text, whitespace
    aside); without spans, whether one comes from a judged-relevant document; None: nothing to
    judge by."""
    evidence = example.evidence
    if evidence:
        texts = {d.id: d.text for d in example.documents}
        quotes = [" ".join(texts.get(doc_id, "")[s:e].split()) for doc_id, s, e in evidence]
        for c in contexts:
            words = " ".join(c.text.split())
            for (doc_id, s, e), quote in zip(evidence, quotes, strict=True):
                if c.doc_id == doc_id and c.span is not None and c.span[0] < e and s < c.span[1]:
                    return True
                if quote and quote in words:
                    return True
        return False
    qrels = example.meta.get("qrels")
    if isinstance(qrels, dict) and qrels:
        return any(c.doc_id is not None and qrels.get(c.doc_id, 0) >= 1 for c in contexts)
    return None


def _unranked(contexts: list[Context] | None, example: Example) -> str | None:
    """Why the contexts' ranks are unknown (the pipeline reported none, or some are in none of
    the example's documents: ``unlocated``), else None."""
    if contexts is None:
        return (
            "the pipeline reported no contexts (return `contexts` with the answer to score its "
            "retrieval)"
        )
    missing = unlocated(contexts, example)
    if not missing:
        return None
    return (
        f"{missing} of {len(contexts)} contexts are in none of the run's documents (by "
        "document id, or by text: as it is, whitespace-normalised, or cleaned as the corpus "
        "is): ranks unknown"
    )


def retrieval_scores(contexts: list[Context] | None, example: Example) -> dict[str, float | None]:
    """``hit/recall/mrr/ndcg@1,5,10`` of the contexts' documents (in their order, first
    occurrence) against the example's judgements; {} when it has none. None for each (NaN in
    the table; ``scored_retrieval`` notes why) when their ranks are unknown (``_unranked``): a 0
    would be a guess."""
    try:
        qrels = judgements(example)
    except ValueError:  # neither qrels nor evidence spans
        return {}
    names = [f"{m}@{k}" for m in MEASURES for k in CUTOFFS]
    if _unranked(contexts, example):
        return dict.fromkeys(names)
    docs = list(dict.fromkeys(c.doc_id for c in contexts or () if c.doc_id is not None))
    run = {example.id: {d: float(len(docs) - i) for i, d in enumerate(docs)}}
    return {n: v[example.id] for n, v in per_query(run, {example.id: qrels}, names).items()}


def scored_retrieval(record: Record, contexts: list[Context] | None, example: Example) -> Record:
    """``record`` with its ``retrieval_scores`` and, where they are None, a ``retrieval_note``
    saying why."""
    scores = retrieval_scores(contexts, example)
    why = _unranked(contexts, example) if scores else None
    note = {"retrieval_note": f"{why}: hit/recall/mrr/ndcg are NaN"} if why else {}
    return dataclasses.replace(record, scores=record.scores | scores, meta=record.meta | note)


def _kept(c: Context) -> dict[str, object]:
    text = c.text if len(c.text) <= MAX_CONTEXT_CHARS else c.text[:MAX_CONTEXT_CHARS]
    out = {"id": c.id, "doc_id": c.doc_id, "span": list(c.span) if c.span else None, "text": text}
    return out | ({"score": c.score} if c.score is not None else {})


def context_meta(contexts: list[Context] | None, example: Example) -> dict[str, object]:
    """The record's view of the contexts; a pipeline that reported none (``None``) keeps
    ``contexts: None`` (a judge reads no context: ``strategies.contexts.pipeline_context``) and
    an unknown ``gold_hit``."""
    if contexts is None:
        return {
            "contexts": None,
            "contexts_truncated": False,
            "retrieved": [],
            "gold_hit": None,
            "gold_docs": [],
        }
    kept = contexts[:MAX_CONTEXTS]
    truncated = len(contexts) > MAX_CONTEXTS or any(len(c.text) > MAX_CONTEXT_CHARS for c in kept)
    qrels = example.meta.get("qrels")
    if isinstance(qrels, dict) and qrels:
        relevant = {d for d, grade in qrels.items() if grade >= 1}
    else:
        relevant = {d for d, _, _ in example.evidence}
    return {
        "contexts": [_kept(c) for c in kept],
        "contexts_truncated": truncated,
        "retrieved": [c.id or f"{c.doc_id}#ctx{i}" for i, c in enumerate(kept)],
        "gold_hit": _gold_hit(contexts, example),
        "gold_docs": sorted(str(d) for d in relevant),
    }


def truncation_marker(chars: int) -> str:
    """What ends an answer cut to ``MAX_ANSWER_CHARS``."""
    return f"[truncated by ragbench: {chars:,} characters, the first {MAX_ANSWER_CHARS:,} kept]"


def _usage_completion(
    answer: PipelineAnswer, question: str, seconds: float, res: Resources
) -> Completion:
    """The call's accounting: reported counts, else counted with the run's tokenizer."""
    u = answer.usage or Usage()
    joined = "\n\n".join([*(c.text for c in answer.contexts or ()), question])
    prompt = u.prompt_tokens
    completion = u.completion_tokens
    estimated = prompt is None or completion is None
    return Completion(
        text=answer.answer,
        prompt_tokens=res.llm.count_tokens(joined) if prompt is None else prompt,
        completion_tokens=res.llm.count_tokens(answer.answer) if completion is None else completion,
        cached_prompt_tokens=u.cached_prompt_tokens,
        decode_seconds=seconds,  # the wall time of the call: what its user waited
        model=u.model,
        usage_estimated=estimated,
    )


def _read(example: Example, res: Resources, contexts: list[Context]) -> str:
    """The run's RAG prompt (the example's format) over a retriever's contexts (best first,
    within the window)."""
    fmt = prompt_format(example)
    frame = fmt.frame(example, RETRIEVED)
    scored = [
        ScoredChunk(
            Chunk(c.id or f"ctx{i}", c.doc_id or "", c.text, *(c.span or (0, 0))),
            c.score if c.score is not None else float(-i),
        )
        for i, c in enumerate(contexts)
    ]
    cite = any(c.doc_id for c in contexts) or fmt.chunk_marker is not None
    marker = fmt.chunk_marker or CITE_MARKER
    ctx = fit_chunks(scored, res, frame, res.room(frame), cite=cite, marker=marker)
    return frame.prompt(ctx.text)


def pipeline_steps(example: Example, res: Resources, params: PipelineParams) -> Steps:
    system = open_pipeline(params)
    what = repr(params.target or params.url)
    corpus = set_up(params, example) or example.meta.get("corpus_fingerprint")
    question = example.question
    index = RUN_CORPUS if params.indexes_corpus else OWN_INDEX
    tags = {"pipeline_kind": system.kind, "pipeline_index": index}  # in every record's meta
    t0 = time.perf_counter()
    if system.kind == "retriever":
        nodes = pipeline_target.call_with_deadline(
            lambda: system.obj.retrieve(question), params.timeout, what
        )
        seconds = time.perf_counter() - t0
        contexts = [_located(_node_context(n), example) for n in nodes]
        prompt, rid = _read(example, res, contexts), f"{example.id}:pipeline"
        completion = yield res.request(prompt, rid=rid, fmt=prompt_format(example))
        cost = res.cost(completion).with_retrieval(seconds, seconds)  # its retriever's call
        meta = context_meta(contexts, example) | tags
        record = make_record(example, params, completion, res, meta, cost)
        return scored_retrieval(record, contexts, example)
    if system.kind == "http":
        call = lambda: pipeline_http.post(params, question, example.id, corpus)  # noqa: E731
    elif system.kind == "query_engine":
        call = lambda: _query(system.obj, question)  # noqa: E731
    else:
        args = (question, example.id, corpus)[: system.arity]
        call = lambda: system.obj(*args)  # noqa: E731
    # an endpoint's deadline is httpx's, per attempt (its retries wait in between)
    deadline = None if system.kind == "http" else params.timeout
    raw = pipeline_target.call_with_deadline(call, deadline, what)
    seconds = time.perf_counter() - t0
    try:
        answer = PipelineAnswer.parse(raw)
    except MalformedAnswer as exc:
        raise MalformedAnswer(f"pipeline {what} returned a malformed answer: {exc}") from None
    reported = None if answer.contexts is None else [_located(c, example) for c in answer.contexts]
    completion = _usage_completion(answer, question, seconds, res)
    full = len(completion.text)
    if full > MAX_ANSWER_CHARS:  # counted whole above; stored and scored cut
        kept = f"{completion.text[:MAX_ANSWER_CHARS]} {truncation_marker(full)}"
        completion = dataclasses.replace(completion, text=kept)
    # the run's architecture facts (FLOPs, KV bytes) hold only for the run's own model
    own_model = completion.model in ("", getattr(res.llm, "name", ""))
    cost = res.cost(completion) if own_model else Cost.of(completion, None, res.sheet)
    meta = context_meta(reported, example) | tags
    if answer.usage is not None and answer.usage.latency_seconds is not None:
        meta["pipeline_latency_seconds"] = float(answer.usage.latency_seconds)
    if answer.version is not None:
        meta["pipeline_version"] = answer.version
    if full > MAX_ANSWER_CHARS:
        meta["answer_truncated"] = full  # characters the pipeline answered
    # the pipeline's answer is its answer: scored whole (trimmed), not ragbench's one-line reading
    record = make_record(example, params, completion, res, meta, cost, completion.text.strip())
    return scored_retrieval(record, reported, example)
    yield  # unreachable here; makes this a generator, the shape every strategy's steps have
