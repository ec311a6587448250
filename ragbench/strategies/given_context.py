"""The context a strategy gave the model, rebuilt (for ``judge_faithful``).

Records do not store their prompt (a long-context prompt is the whole document, repeated in every
record). The strategies' prompt builders are deterministic functions of the example, the
parameters, the retrieval index and the tokenizer of the model under test, so the context is
rebuilt by calling them again with the run's ``Resources``, and checked against what the record
holds: the retrieved chunk ids (RAG) and the kept token count (long context). A mismatch is an
error (the judgement is then left unscored with a note), never a silent guess.

Each strategy names its rebuilder in its ``Strategy(...)`` line (``strategies/__init__.py``).
"""

from __future__ import annotations

from ragbench.strategies.base import Resources
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.prompt_format import FULL, RETRIEVED, prompt_format
from ragbench.strategies.rag import rag_prompt
from ragbench.types import Example, Record


class ContextUnavailable(ValueError):
    """The context cannot be rebuilt faithfully; the message says why."""


def no_context(example: Example, record: Record, res: Resources) -> None:
    """Closed book: the model read no context."""
    return None


def rag_context(example: Example, record: Record, res: Resources, decline: bool = False) -> str:
    """The retrieved chunks as the RAG prompt placed them (checked against the record's ids)."""
    prompt, rebuilt = rag_prompt(example, res, record.params, decline=decline)
    retrieved = list(record.meta.get("retrieved", []))
    if list(rebuilt["retrieved"]) != retrieved:
        raise ContextUnavailable(
            "retrieval now returns other chunks than the record's "
            f"({rebuilt['retrieved'][:3]}... vs {retrieved[:3]}...)"
        )
    frame = prompt_format(example).frame(example, RETRIEVED, decline, record.params.cot)
    return frame.context_of(prompt.removesuffix(frame.tail))


def long_context_context(
    example: Example, record: Record, res: Resources, decline: bool = False, meta_prefix: str = ""
) -> str:
    """The (possibly truncated) whole context (checked against the record's kept tokens)."""
    cot = getattr(record.params, "cot", False)  # Self-Route's long-context leg has none
    _, prefix, rebuilt = long_context_prompt(example, res, record.params.overflow, decline, cot)
    kept = record.meta.get(f"{meta_prefix}kept_tokens")
    if kept is not None and int(kept) != int(rebuilt["kept_tokens"]):
        raise ContextUnavailable(
            f"the context now keeps {rebuilt['kept_tokens']} tokens, the record {kept}"
        )
    return prompt_format(example).frame(example, FULL, decline, cot).context_of(prefix)


def self_route_context(example: Example, record: Record, res: Resources) -> str:
    """The context of the branch the record's ``route`` names (the RAG call offers the decline
    option, the long-context call does not)."""
    route = record.meta.get("route")
    if route == "rag":
        return rag_context(example, record, res, decline=True)
    if route == "long_context":
        return long_context_context(example, record, res, decline=False, meta_prefix="lc_")
    raise ContextUnavailable(f"self_route record without a known route ({route!r})")


def pipeline_context(example: Example, record: Record, res: Resources) -> str:
    """The contexts a pipeline reported, as it recorded them (best first, blank-line separated)."""
    if record.meta.get("contexts_truncated"):
        raise ContextUnavailable(
            "the record keeps the pipeline's contexts cut short (see pipeline.MAX_CONTEXT_CHARS)"
        )
    return "\n\n".join(str(c.get("text", "")) for c in record.meta.get("contexts") or [])
