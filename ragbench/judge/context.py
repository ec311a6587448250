"""The context a strategy gave the model, rebuilt for ``judge_faithful``.

Records do not store their prompt (a long-context prompt is the whole document, repeated in every
record). The strategies' prompt builders are deterministic functions of the example, the
parameters, the retrieval index and the tokenizer of the model under test, so the context is
rebuilt by calling them again with the run's ``Resources``, and checked against what the record
holds: the retrieved chunk ids (RAG) and the kept token count (long context). A mismatch is an
error (the judgement is then left unscored with a note), never a silent guess.
"""

from __future__ import annotations

from typing import Any

from ragbench.types import Example, Record


class ContextUnavailable(ValueError):
    """The context cannot be rebuilt faithfully; the message says why."""


def given_context(example: Example, record: Record, res: Any) -> str | None:
    """The context text the model read for ``record`` (None: it read none, closed book).
    ``res`` is the run's ``strategies.Resources`` (the model under test's tokenizer, the index)."""
    from ragbench.strategies.long_context import long_context_prompt
    from ragbench.strategies.prompts import CONTEXT_TEMPLATE
    from ragbench.strategies.rag import rag_prompt

    strategy, params, meta = record.strategy, record.params, record.meta
    if strategy == "closed_book":
        return None
    if strategy == "self_route":
        route = meta.get("route")
        if route not in ("rag", "long_context"):
            raise ContextUnavailable(f"self_route record without a known route ({route!r})")
        strategy = route
        decline, lc_prefix = True, "lc_"
    else:
        decline, lc_prefix = False, ""
    if strategy == "rag":
        prompt, rebuilt = rag_prompt(example, res, params, decline=decline)
        if list(rebuilt["retrieved"]) != list(meta.get("retrieved", [])):
            raise ContextUnavailable(
                "retrieval now returns other chunks than the record's "
                f"({rebuilt['retrieved'][:3]}... vs {list(meta.get('retrieved', []))[:3]}...)"
            )
        from ragbench.strategies.prompts import question_part

        tail = question_part(example, decline)
        return _strip_template(prompt.removesuffix(tail), CONTEXT_TEMPLATE)
    if strategy == "long_context":
        _, prefix, rebuilt = long_context_prompt(example, res, params.overflow, decline=decline)
        kept = meta.get(f"{lc_prefix}kept_tokens")
        if kept is not None and int(kept) != int(rebuilt["kept_tokens"]):
            raise ContextUnavailable(
                f"the context now keeps {rebuilt['kept_tokens']} tokens, the record {kept}"
            )
        return _strip_template(prefix, CONTEXT_TEMPLATE)
    raise ContextUnavailable(f"no rule to rebuild the context of strategy {strategy!r}")


def _strip_template(text: str, template: str) -> str:
    """The ``{context}`` part of ``template.format(context=...)``."""
    head, _, tail = template.partition("{context}")
    return text.removeprefix(head).removesuffix(tail)
