"""Long context: the whole context, document first and question last, so one document's KV cache
(``GenerationRequest.prefix``) serves every question on it. Over the window (or the run's matched
``prompt_budget``) the ``overflow`` policy decides; the record says how many tokens were cut.

Many questions over one shared corpus (the ``corpus`` dataset: ``meta["corpus_fingerprint"]``)
get the same context, fitted once per run against a fixed reserve for the question
(``QUESTION_RESERVE`` tokens) rather than against each question's length: otherwise every
question would cut the corpus at a different token and no prefix cache could serve two of them.

KV-cache techniques (``LongContextParams.kv_cache``: offloaded, sinks, quantized, snapkv) are
fields of the request; the transformers backend keeps the cache that way (``ragbench.llm.kv_cache``)
and measures its bytes, other backends refuse with an error naming what they support. A variant's
request runs alone, without the shared document prefix (SnapKV compresses per question). RoPE scaling
is a load-time option of the model; ``rope_scaling`` names it in the record and must match."""

from __future__ import annotations

import dataclasses
from typing import Any

from ragbench.strategies import preload
from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.params import LongContextParams
from ragbench.strategies.prompts import CONTEXT_TEMPLATE, question_part, truncate
from ragbench.types import Example

QUESTION_RESERVE = 256  # tokens kept free for the question when a shared corpus must be cut


def long_context_prompt(
    example: Example, res: Resources, overflow: str = "error", decline: bool = False
) -> tuple[str, str, dict[str, Any]]:
    """(prompt, prefix, meta) with the context fitted to the limit under ``overflow``."""
    from ragbench.llm.base import ContextOverflowError

    tail = question_part(example, decline)
    shared = example.meta.get("corpus_fingerprint")
    if shared:
        key = (str(shared), overflow)
        if key not in res.fitted:
            reserve = "x " * QUESTION_RESERVE  # a stand-in question of the reserved length
            res.fitted[key] = _fit(example, res, reserve, overflow)
        kept, context_tokens = res.fitted[key]
    else:
        kept, context_tokens = _fit(example, res, tail, overflow)
    if res.excess(kept, tail) > 0:  # a question longer than the reserve (or a budget overflow)
        raise ContextOverflowError(
            res.prompt_tokens(CONTEXT_TEMPLATE.format(context=kept) + tail),
            res.max_new_tokens,
            res.limit() + res.max_new_tokens,
            getattr(res.llm, "name", "llm"),
        )
    prefix = CONTEXT_TEMPLATE.format(context=kept)
    kept_tokens = res.llm.count_tokens(kept)
    meta = {
        "input_context_tokens": context_tokens,
        "kept_tokens": kept_tokens,
        "truncated_tokens": context_tokens - kept_tokens,
    }
    return prefix + tail, prefix, meta


def _fit(example: Example, res: Resources, tail: str, overflow: str) -> tuple[str, int]:
    """(the context kept before ``tail`` under ``overflow``, the context's own token count)."""
    from ragbench.llm.base import ContextOverflowError

    context = example.context
    available = res.room(tail)
    context_tokens = res.llm.count_tokens(context)
    if context_tokens <= available:
        return context, context_tokens
    if overflow == "error":
        raise ContextOverflowError(
            context_tokens + res.prompt_tokens(tail),
            res.max_new_tokens,
            res.limit() + res.max_new_tokens,
            getattr(res.llm, "name", "llm"),
        )
    kept = truncate(context, available, overflow, res.llm.count_tokens)
    # Tokens can merge across the join with the template and the question, so measure the real
    # prompt and cut again by the excess until it fits (usually once, by one token).
    while kept and (excess := res.excess(kept, tail)) > 0:
        available -= excess
        kept = truncate(context, available, overflow, res.llm.count_tokens)
    return kept, context_tokens


def check_rope(params: LongContextParams, llm: Any) -> None:
    """The record's ``rope_scaling`` must be what the model was loaded with (its identity). Only
    the transformers backend scales RoPE; the dry run counts prompts and loads no model."""
    identity = llm.identity()
    if identity.get("backend") == "dry-run":
        return
    loaded = identity.get("rope_scaling")
    if params.rope_scaling != loaded:
        raise ValueError(
            f"long_context rope_scaling={params.rope_scaling!r}, but the model was loaded with "
            f"{loaded!r}: RoPE scaling is a load-time option of the hf backend (llm params "
            "rope_scaling: dynamic | yarn | linear, and rope_factor); set both to match"
        )


def long_context_steps(example: Example, res: Resources, params: LongContextParams) -> Steps:
    check_rope(params, res.llm)
    if params.preload:  # the corpus KV once, before the first question (run_batch does it too)
        preload.ensure([(example, params)], res)
    prompt, prefix, meta = long_context_prompt(example, res, params.overflow)
    request = res.request(prompt, prefix, rid=f"{example.id}:long_context")
    if params.kv_cache != "plain":  # the KV-cache technique travels with the request
        request = dataclasses.replace(request, **params.kv_fields())
    completion = yield request
    cost = res.cost(completion)
    if params.preload:  # the corpus KV was computed once before the questions: its share
        cost = preload.amortised(cost, example, params, res)
    return make_record(example, params, completion, res, meta, cost)
