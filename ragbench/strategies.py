"""Strategies: how an example becomes a prompt, an answer, and a Record with scores and cost.

- ``closed_book``: the question alone (what the model knows without context).
- ``long_context``: the whole context, document first and question last, so one document's KV
  cache (``GenerationRequest.prefix``) serves every question on it. Over the window (or the
  run's matched ``prompt_budget``) the ``overflow`` policy decides: ``error`` (default),
  ``truncate_middle`` (LongBench: keep the head and the tail), ``truncate_head`` (drop the
  start), ``truncate_tail`` (drop the end). The record says how many tokens were cut.
- ``rag``: retrieve, assemble within a token budget and/or top-k, in score or document order,
  then answer with the same template as long context. Records chunk ids and gold hits.
- ``self_route`` (Li et al. 2024): the RAG prompt with an explicit "unanswerable" option; a
  declined query goes to long context. Cost = RAG cost + long-context cost when routed.

Each strategy is written once as *steps*: a generator that yields the ``GenerationRequest`` it
needs, receives the ``Completion`` and finally returns the ``Record``. ``drive`` runs one such
generator a request at a time (``closed_book(example, res)`` etc. and ``Strategy.run`` are that);
``run_batch`` runs many together, sending each round's requests to the LLM in one ``generate``
call, so the backend can batch them (padded batches and shared document prefixes on
transformers, concurrent requests on an OpenAI-compatible server). Rounds depend only on the
items given, so results are deterministic.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragbench.cost import combine_costs, cost_fields
from ragbench.metrics import score
from ragbench.registry import did_you_mean, unknown
from ragbench.types import Completion, Example, GenerationRequest, Record

# ---------------------------------------------------------------------------- prompts

INSTRUCTIONS = {
    "needle": "Answer with the requested value only.",
    "qa": "Answer with a short phrase, no explanation.",
}
CONTEXT_TEMPLATE = "{context}\n\n"
QUESTION_TEMPLATE = (
    "Answer the question based on the text above. {instruction}\nQuestion: {question}\nAnswer:"
)
CLOSED_BOOK_TEMPLATE = "Answer the question. {instruction}\nQuestion: {question}\nAnswer:"
# Answers are one line (clean_answer keeps the first); small models restate and repeat after a
# blank line, so stopping there saves decode time without changing the scored answer.
ANSWER_STOP = ("\n\n",)
DECLINE = "unanswerable"
DECLINE_INSTRUCTION = f' If the text above does not contain the answer, reply exactly "{DECLINE}".'


def task_type(example: Example) -> str:
    """``needle`` for NIAH/RULER retrieval tasks (exact value), ``qa`` otherwise."""
    explicit = example.meta.get("task_type")
    if explicit in INSTRUCTIONS:
        return explicit
    task = str(example.meta.get("task", "")).lower()
    return "needle" if ("niah" in task or "needle" in task or "magic" in example.question) else "qa"


def question_part(example: Example, decline: bool = False) -> str:
    instruction = INSTRUCTIONS[task_type(example)] + (DECLINE_INSTRUCTION if decline else "")
    return QUESTION_TEMPLATE.format(instruction=instruction, question=example.question)


def clean_answer(text: str, question: str = "") -> str:
    """First non-empty line, without an "Answer:" / "A:" label (any case) or a restated question.
    A line that is only a label gives way to the next non-empty line ("Answer:", "Paris")."""
    t = ""
    for line in text.splitlines():
        t = line.strip()
        for label in ("answer:", "a:"):
            if t.lower().startswith(label):
                t = t[len(label) :].strip()
        if t:
            break
    q = question.strip()
    if q and t.lower().startswith(q.lower()):
        t = t[len(q) :].strip()
    return t.strip(" \"'")


def is_declined(answer: str) -> bool:
    return DECLINE in answer.lower()


# ---------------------------------------------------------------------------- truncation


def _longest_fit(text: str, n_tokens: int, count: Callable[[str], int], head: bool) -> str:
    """Longest head (or tail) of ``text`` with at most ``n_tokens`` tokens: binary search on
    characters, so it works with any backend's ``count_tokens`` (no encode/decode needed)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        piece = text[:mid] if head else text[len(text) - mid :]
        if count(piece) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] if head else text[len(text) - lo :]


def truncate(text: str, n_tokens: int, policy: str, count: Callable[[str], int]) -> str:
    """Cut ``text`` to at most ``n_tokens`` tokens under ``policy`` (see module docstring)."""
    if n_tokens <= 0:
        return ""
    if policy == "truncate_head":  # keep the end
        return _longest_fit(text, n_tokens, count, head=False)
    if policy == "truncate_tail":  # keep the start
        return _longest_fit(text, n_tokens, count, head=True)
    if policy == "truncate_middle":
        budget = n_tokens
        while budget > 0:  # token counts are not additive across a join: shrink until it fits
            head = _longest_fit(text, budget // 2, count, head=True)
            tail = _longest_fit(text[len(head) :], budget - budget // 2, count, head=False)
            joined = head + tail
            if count(joined) <= n_tokens:
                return joined
            budget -= max(1, count(joined) - n_tokens)
        return ""
    raise unknown("overflow policy", policy, OVERFLOW)


# ---------------------------------------------------------------------------- resources


@dataclass
class Resources:
    """What a strategy needs besides the example; built once per run by the runner."""

    llm: Any  # ragbench.llm.base.LLM (possibly a CachedLLM)
    metrics: tuple[str, ...] = ("string_match_all",)
    max_new_tokens: int = 32
    prompt_budget: int | None = None  # matched budgets: prompt-token cap for every strategy
    preset: Any = None  # ModelPreset for FLOPs / KV bytes
    kv_dtype: str | None = None  # dtype the KV cache is stored in; None: 2 bytes/value assumed
    sheet: Any = None  # PriceSheet for dollars
    index: Callable[[Example], tuple[list, Any]] | None = None  # example -> (chunks, retriever)

    def limit(self) -> int:
        """Prompt tokens allowed: the window minus the answer, capped by the matched budget."""
        window = self.llm.context_window - self.max_new_tokens
        return min(window, self.prompt_budget) if self.prompt_budget else window


Steps = Generator[GenerationRequest, Completion, Record]  # yields requests, returns the Record


def _request(res: Resources, prompt: str, prefix: str = "", rid: str = "") -> GenerationRequest:
    return GenerationRequest(
        prompt=prompt, prefix=prefix, max_new_tokens=res.max_new_tokens, stop=ANSWER_STOP, id=rid
    )


def _excess(res: Resources, context: str, tail: str) -> int:
    """Tokens by which the assembled prompt exceeds the limit (<= 0: it fits)."""
    return _overhead(res, CONTEXT_TEMPLATE.format(context=context) + tail) - res.limit()


def _overhead(res: Resources, text: str) -> int:
    """Prompt tokens of ``text`` alone, chat template included (what the context must leave)."""
    return res.llm.prompt_tokens(GenerationRequest(prompt=text, max_new_tokens=res.max_new_tokens))


def _record(example, strategy, params, completion, res, meta, cost=None) -> Record:
    prediction = clean_answer(completion.text, example.question)
    cost = cost or cost_fields(completion, res.preset, res.sheet, res.kv_dtype)
    return Record(
        example_id=example.id,
        strategy=strategy,
        params=params,
        prediction=prediction,
        answers=example.answers,
        scores=score(prediction, example.answers, res.metrics),
        cost=cost,
        meta={"raw": completion.text, **meta},
    )


# ---------------------------------------------------------------------------- strategies


def closed_book_steps(example: Example, res: Resources, **params: Any) -> Steps:
    prompt = CLOSED_BOOK_TEMPLATE.format(
        instruction=INSTRUCTIONS[task_type(example)], question=example.question
    )
    completion = yield _request(res, prompt, rid=f"{example.id}:closed_book")
    return _record(example, "closed_book", params, completion, res, {})


def long_context_prompt(
    example: Example, res: Resources, overflow: str = "error", decline: bool = False
) -> tuple[str, str, dict[str, Any]]:
    """(prompt, prefix, meta) with the context fitted to the limit under ``overflow``."""
    from ragbench.llm.base import ContextOverflowError

    tail = question_part(example, decline)
    context = example.context
    available = res.limit() - _overhead(res, CONTEXT_TEMPLATE.format(context="") + tail)
    context_tokens = res.llm.count_tokens(context)
    kept = context
    if context_tokens > available:
        if overflow == "error":
            total = context_tokens + _overhead(res, tail)
            raise ContextOverflowError(
                total,
                res.max_new_tokens,
                res.limit() + res.max_new_tokens,
                getattr(res.llm, "name", "llm"),
            )
        kept = truncate(context, available, overflow, res.llm.count_tokens)
        # Tokens can merge across the join with the template and the question, so measure the
        # real prompt and cut again by the excess until it fits (usually once, by one token).
        while kept and (excess := _excess(res, kept, tail)) > 0:
            available -= excess
            kept = truncate(context, available, overflow, res.llm.count_tokens)
    prefix = CONTEXT_TEMPLATE.format(context=kept)
    kept_tokens = res.llm.count_tokens(kept)
    meta = {
        "input_context_tokens": context_tokens,
        "kept_tokens": kept_tokens,
        "truncated_tokens": context_tokens - kept_tokens,
    }
    return prefix + tail, prefix, meta


def long_context_steps(
    example: Example, res: Resources, overflow: str = "error", **params: Any
) -> Steps:
    prompt, prefix, meta = long_context_prompt(example, res, overflow)
    completion = yield _request(res, prompt, prefix, rid=f"{example.id}:long_context")
    return _record(example, "long_context", {"overflow": overflow, **params}, completion, res, meta)


def rag_prompt(
    example: Example,
    res: Resources,
    top_k: int | None,
    budget: int | None,
    order: str,
    cite: bool,
    decline: bool = False,
) -> tuple[str, dict[str, Any]]:
    """(prompt, meta): retrieve, assemble within the budget (and the limit), ask."""
    from ragbench.retrieval.chunking import gold_chunk_ids
    from ragbench.retrieval.context import assemble_context

    if res.index is None:
        raise ValueError("rag needs a retrieval index; the run config has no retrieval section")
    tail = question_part(example, decline)
    t0 = time.perf_counter()
    chunks, retriever = res.index(example)
    t1 = time.perf_counter()
    k = min(len(chunks), top_k or MAX_CANDIDATES)
    scored = retriever.retrieve([example.question], k)[0]
    t2 = time.perf_counter()
    available = res.limit() - _overhead(res, CONTEXT_TEMPLATE.format(context="") + tail)
    cap = min(budget, available) if budget else available
    doc_order = [d.id for d in example.documents]
    ctx = assemble_context(
        scored, res.llm.count_tokens, cap, top_k, order, cite=cite, doc_order=doc_order
    )
    # as in long_context_prompt: the joined prompt can count more than its parts
    while ctx.chunk_ids and (excess := _excess(res, ctx.text, tail)) > 0:
        cap -= excess
        ctx = assemble_context(
            scored, res.llm.count_tokens, cap, top_k, order, cite=cite, doc_order=doc_order
        )
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


def _with_retrieval_time(cost: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    return {**cost, "retrieval_seconds": meta["index_seconds"] + meta["retrieve_seconds"]}


def rag_steps(
    example: Example,
    res: Resources,
    top_k: int | None = 5,
    budget: int | None = None,
    order: str = "score",
    cite: bool = True,
    **params: Any,
) -> Steps:
    prompt, meta = rag_prompt(example, res, top_k, budget, order, cite)
    completion = yield _request(res, prompt, rid=f"{example.id}:rag")
    cost = _with_retrieval_time(cost_fields(completion, res.preset, res.sheet, res.kv_dtype), meta)
    p = {"top_k": top_k, "budget": budget, "order": order, "cite": cite, **params}
    return _record(example, "rag", p, completion, res, meta, cost)


def self_route_steps(
    example: Example,
    res: Resources,
    top_k: int | None = 5,
    budget: int | None = None,
    order: str = "score",
    cite: bool = True,
    overflow: str = "error",
    **params: Any,
) -> Steps:
    prompt, meta = rag_prompt(example, res, top_k, budget, order, cite, decline=True)
    first = yield _request(res, prompt, rid=f"{example.id}:self_route:rag")
    rag_cost = _with_retrieval_time(cost_fields(first, res.preset, res.sheet, res.kv_dtype), meta)
    p = {
        "top_k": top_k,
        "budget": budget,
        "order": order,
        "cite": cite,
        "overflow": overflow,
        **params,
    }
    if not is_declined(clean_answer(first.text, example.question)):
        return _record(example, "self_route", p, first, res, {**meta, "route": "rag"}, rag_cost)
    lc_prompt, prefix, lc_meta = long_context_prompt(example, res, overflow)
    second = yield _request(res, lc_prompt, prefix, rid=f"{example.id}:self_route:long_context")
    lc_cost = cost_fields(second, res.preset, res.sheet, res.kv_dtype)
    peak = getattr(res.sheet, "peak_flops", None)
    cost = {
        **combine_costs([rag_cost, lc_cost], peak),
        "retrieval_seconds": rag_cost["retrieval_seconds"],
    }
    lc_meta = {f"lc_{k}": v for k, v in lc_meta.items()}
    meta = {**meta, **lc_meta, "route": "long_context", "rag_raw": first.text}
    return _record(example, "self_route", p, second, res, meta, cost)


# ---------------------------------------------------------------------------- drivers


def _advance(steps: Steps, completion: Completion | None) -> GenerationRequest | Record:
    """The next request of ``steps`` or its Record; the strategy's own errors propagate."""
    try:
        return next(steps) if completion is None else steps.send(completion)
    except StopIteration as finished:
        return finished.value


def drive(steps: Steps, llm: Any) -> Record:
    """Run a strategy's steps one request at a time."""
    out = _advance(steps, None)
    while isinstance(out, GenerationRequest):
        out = _advance(steps, llm.generate([out])[0])
    return out


def _one_at_a_time(steps_fn: Callable[..., Steps]) -> Callable[..., Record]:
    """``steps_fn`` as a plain strategy: (example, res, **params) -> Record."""

    @functools.wraps(steps_fn)
    def strategy(example: Example, res: Resources, **params: Any) -> Record:
        return drive(steps_fn(example, res, **params), res.llm)

    strategy.__name__ = strategy.__qualname__ = steps_fn.__name__.removesuffix("_steps")
    return strategy


closed_book = _one_at_a_time(closed_book_steps)
long_context = _one_at_a_time(long_context_steps)
rag = _one_at_a_time(rag_steps)
self_route = _one_at_a_time(self_route_steps)


def run_batch(
    items: Sequence[tuple[str, Example, dict[str, Any]]], res: Resources
) -> list[Record | Exception]:
    """Run (strategy, example, params) items together; each round's requests go to the LLM in one
    ``generate`` call. Returns a Record or the exception per item, in order: one failing item
    never stops the others. If the batched call itself fails, that round's requests are retried
    one by one so the error lands on the request that caused it."""
    results: list[Record | Exception | None] = [None] * len(items)
    waiting: dict[int, tuple[Steps, GenerationRequest]] = {}

    def step(i: int, steps: Steps, completion: Completion | None) -> None:
        try:
            out = _advance(steps, completion)
        except Exception as exc:  # the strategy failed: an error record for this item only
            results[i] = exc
            return
        if isinstance(out, GenerationRequest):
            waiting[i] = (steps, out)
        else:
            results[i] = out

    for i, (name, example, params) in enumerate(items):
        try:
            steps = get_strategy(name).steps(example, res, **params)
        except Exception as exc:
            results[i] = exc
            continue
        step(i, steps, None)
    while waiting:
        round_ = sorted(waiting)
        requests = [waiting[i][1] for i in round_]
        try:
            completions: list[Completion | Exception] = list(res.llm.generate(requests))
        except Exception:
            completions = []
            for request in requests:
                try:
                    completions.append(res.llm.generate([request])[0])
                except Exception as exc:
                    completions.append(exc)
        current = {i: waiting.pop(i)[0] for i in round_}
        for i, completion in zip(round_, completions, strict=True):
            if isinstance(completion, Exception):
                current[i].close()
                results[i] = completion
            else:
                step(i, current[i], completion)
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------- registry

MAX_CANDIDATES = 200  # chunks retrieved when only a token budget limits the context
OVERFLOW = ("error", "truncate_middle", "truncate_head", "truncate_tail")
ORDERS = ("score", "document")
_RAG = {"top_k": 5, "budget": None, "order": "score", "cite": True}


@dataclass(frozen=True)
class Strategy:
    name: str
    steps: Callable[..., Steps]  # (example, res, **params) -> Steps
    defaults: dict[str, Any] = field(default_factory=dict)
    needs_retrieval: bool = False

    def run(self, example: Example, res: Resources, **params: Any) -> Record:
        """One request at a time (``run_batch`` runs many together)."""
        return drive(self.steps(example, res, **params), res.llm)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("closed_book", closed_book_steps),
        Strategy("long_context", long_context_steps, {"overflow": "error"}),
        Strategy("rag", rag_steps, dict(_RAG), needs_retrieval=True),
        Strategy(
            "self_route", self_route_steps, {**_RAG, "overflow": "error"}, needs_retrieval=True
        ),
    )
}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise unknown("strategy", name, STRATEGIES)
    return STRATEGIES[name]


def _check_value(strategy: str, key: str, value: Any) -> None:
    if key == "overflow" and value not in OVERFLOW:
        raise unknown(f"{strategy} overflow policy", str(value), OVERFLOW)
    if key == "order" and value not in ORDERS:
        raise unknown(f"{strategy} order", str(value), ORDERS)
    if (
        key in ("top_k", "budget")
        and value is not None
        and (not isinstance(value, int) or value < 1)
    ):
        raise ValueError(f"{strategy}: {key} must be a positive integer or null, got {value!r}")


def check_params(name: str, params: dict[str, Any]) -> None:
    """Unknown strategy, parameter or value -> an error naming the valid choices."""
    strategy = get_strategy(name)
    for key, value in params.items():
        if key not in strategy.defaults:
            valid = strategy.defaults or {"(none)": None}
            raise ValueError(f"unknown {name} parameter {key!r}; {did_you_mean(key, valid)}")
        for v in value if isinstance(value, list) else [value]:
            _check_value(name, key, v)
    merged = {**strategy.defaults, **params}
    if strategy.needs_retrieval and not any(merged.get(k) for k in ("top_k", "budget")):
        raise ValueError(f"{name}: set top_k, budget or both (both are null)")


def expand(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Parameter points: defaults filled in, list values expanded into a grid (sorted keys)."""
    check_params(name, params)
    merged = {**get_strategy(name).defaults, **params}
    keys = sorted(merged)
    axes = [merged[k] if isinstance(merged[k], list) else [merged[k]] for k in keys]
    return [dict(zip(keys, point, strict=True)) for point in itertools.product(*axes)]


__all__ = [
    "STRATEGIES",
    "Resources",
    "clean_answer",
    "drive",
    "expand",
    "get_strategy",
    "run_batch",
    "truncate",
]
