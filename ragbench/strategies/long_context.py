"""Long context: the whole context, document first and question last, so one document's KV cache
(``GenerationRequest.prefix``) serves every question on it. Over the window (or the run's matched
``prompt_budget``) the ``overflow`` policy decides; the record says how many tokens were cut."""

from __future__ import annotations

from typing import Any

from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.params import LongContextParams
from ragbench.strategies.prompts import CONTEXT_TEMPLATE, question_part, truncate
from ragbench.types import Example


def long_context_prompt(
    example: Example, res: Resources, overflow: str = "error", decline: bool = False
) -> tuple[str, str, dict[str, Any]]:
    """(prompt, prefix, meta) with the context fitted to the limit under ``overflow``."""
    from ragbench.llm.base import ContextOverflowError

    tail = question_part(example, decline)
    context = example.context
    available = res.room(tail)
    context_tokens = res.llm.count_tokens(context)
    kept = context
    if context_tokens > available:
        if overflow == "error":
            total = context_tokens + res.prompt_tokens(tail)
            raise ContextOverflowError(
                total,
                res.max_new_tokens,
                res.limit() + res.max_new_tokens,
                getattr(res.llm, "name", "llm"),
            )
        kept = truncate(context, available, overflow, res.llm.count_tokens)
        # Tokens can merge across the join with the template and the question, so measure the
        # real prompt and cut again by the excess until it fits (usually once, by one token).
        while kept and (excess := res.excess(kept, tail)) > 0:
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


def long_context_steps(example: Example, res: Resources, params: LongContextParams) -> Steps:
    prompt, prefix, meta = long_context_prompt(example, res, params.overflow)
    completion = yield res.request(prompt, prefix, rid=f"{example.id}:long_context")
    return make_record(example, params, completion, res, meta)
