"""Long context: the whole context, document first and question last, so one document's KV cache
(``GenerationRequest.prefix``) serves every question on it. Over the window (or the run's matched
``prompt_budget``) the ``overflow`` policy decides; the record says how many tokens were cut.

Many questions over one shared corpus (the ``corpus`` dataset) get the same context, fitted
once per run (``fit.py``), so a prefix cache can serve them all.

KV-cache techniques (``LongContextParams.kv``: offloaded, sinks, quantized, snapkv) travel as
the request's ``kv``; the transformers backend keeps the cache that way (``ragbench.llm.kv.variants``)
and measures its bytes, other backends refuse with an error naming what they support. A variant's
request runs alone, without the shared document prefix (SnapKV compresses per question). RoPE scaling
is a load-time option of the model; ``rope_scaling`` names it in the record and must match."""

from __future__ import annotations

import dataclasses

from ragbench.llm.base import LLM
from ragbench.strategies.base import Resources, Steps, answer, make_record
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.params import LongContextParams
from ragbench.strategies.preload import amortised, ensure
from ragbench.strategies.prompt_format import prompt_format
from ragbench.types import Example


def check_rope(params: LongContextParams, llm: LLM) -> None:
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
        ensure([(example, params)], res)
    prompt, prefix, meta = long_context_prompt(example, res, params.overflow, cot=params.cot)
    fmt = prompt_format(example)
    rid = f"{example.id}:long_context"
    request = res.request(prompt, prefix, rid, fmt=fmt, reasoning=params.cot)
    # the KV-cache technique travels with it; a preloaded question is never answered from the
    # completion cache: a stored answer (a plain run's) carries the corpus prefill it paid
    request = dataclasses.replace(request, kv=params.kv, cacheable=not params.preload)
    completion, cost, more = yield from answer(example, res, request, params.cot)
    if params.preload:  # the corpus KV was computed once before the questions: its share
        cost = amortised(cost, example, params, res)
    return make_record(example, params, completion, res, meta | more, cost)
