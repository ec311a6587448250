"""The whole context fitted to the window: the long-context prompt (document first, question
last) under an ``overflow`` policy, shared by long context, Self-Route's long-context branch, the
preload and the judge's context rebuild.

Many questions over one shared corpus (``meta["corpus_fingerprint"]``) get the same context,
fitted once per run against a fixed reserve for the question (``QUESTION_RESERVE`` tokens)
rather than against each question's length: otherwise every question would cut the corpus at a
different token and no prefix cache could serve two of them."""

from __future__ import annotations

from typing import Any

from ragbench.llm.base import ContextOverflowError
from ragbench.strategies.base import Resources
from ragbench.strategies.prompts import CONTEXT_TEMPLATE, question_part, truncate
from ragbench.types import Example

QUESTION_RESERVE = 256  # tokens kept free for the question when a shared corpus must be cut


def long_context_prompt(
    example: Example, res: Resources, overflow: str = "error", decline: bool = False
) -> tuple[str, str, dict[str, Any]]:
    """(prompt, prefix, meta) with the context fitted to the limit under ``overflow``."""
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
