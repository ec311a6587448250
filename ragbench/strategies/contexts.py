"""What one answer read: the source that answered and its contexts, as the record's strategy
declares them. ``Strategy.contexts`` (``registry``) builds a ``Contexts`` for a record or a
results-table row; the judge (``judge_faithful`` reads ``text()``, the context metrics
``texts()``), failure attribution (``source``, ``meta_prefix``) and the noise pass
(``corpus_note``) all ask it, never the strategy's name or the record's meta keys.

Records do not store their prompt (a long-context prompt is the whole document, repeated in every
record). The strategies' prompt builders are deterministic functions of the example, the
parameters, the retrieval index and the tokenizer of the model under test, so a context is
rebuilt by calling them again with the run's ``Resources`` (asked for only when a rebuild needs
them: a thunk, so a judge pass over closed-book or pipeline records never loads the model under
test), and checked against what the record holds: the retrieved chunk ids (RAG) and the kept
token count (long context). A mismatch is ``ContextUnavailable`` (the judgement is then left
unscored with a note), never a silent guess.

- ``text()``: the context as the prompt placed it (a strategy's ``rebuild_context``).
- ``prompts()``: the prompt text of each call the answer took, in order (the last one's reply
  is the answer; a strategy's ``rebuild_prompts``): what the strategy handed the backend, before
  the backend's chat template. Chain of thought's answer step is built from the reasoning the
  record keeps (``cot_reasoning``); Self-Route's long-context call follows its RAG call when the
  record's ``route`` says so. The exports (``ragbench export --format lm-eval``) read it.
- ``texts()``: one text per context, best first (a strategy's ``rebuild_contexts``). A
  pipeline's record keeps them (``meta["contexts"]``, in the order the pipeline returned them,
  taken as its ranking; cut short, ``meta["contexts_truncated"]``: unavailable). A built-in RAG
  record (``rag``; ``self_route``'s first call) keeps the ids of the chunks it placed in the
  prompt (``meta["retrieved"]``); their texts come from the run's index, built again as the
  strategy built it; in rank order (with ``order: document`` the prompt holds them in source
  order, so the retriever is asked again for their ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragbench.strategies.base import Resources
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.prompt_format import FULL, prompt_format
from ragbench.strategies.prompt_format import RETRIEVED as RETRIEVED_FRAME
from ragbench.strategies.rag import MAX_CANDIDATES, rag_prompt
from ragbench.types import Example, Record

# What an answer was read from: the sources failure attribution explains misses by.
NO_CONTEXT = "closed_book"  # the question alone
RETRIEVED = "rag"  # retrieved chunks
FULL_CONTEXT = "long_context"  # the whole (possibly truncated) context
SOURCES = (NO_CONTEXT, RETRIEVED, FULL_CONTEXT)
SCORE_ORDER = "score"  # the context order in which a RAG prompt already is rank order

ResourcesFn = Callable[[], Resources]  # the run's resources, built on first need


class ContextUnavailable(ValueError):
    """The context cannot be rebuilt faithfully; the message says why."""


@dataclass(frozen=True)
class Contexts:
    """What one record (or results-table row) read, as its strategy declares it."""

    strategy: str
    source: str | None  # the call that answered: NO_CONTEXT | RETRIEVED | FULL_CONTEXT (None: none)
    # where that call's facts are in the record ("lc_": a router's long-context branch)
    meta_prefix: str = ""
    # why the answer read no corpus the run indexes or hands to the system (None: it did); the
    # noise pass answers again with distractors added to that corpus
    corpus_note: str | None = None
    # None: the strategy declares none
    rebuild_text: Callable[[], str | None] | None = field(default=None, repr=False, compare=False)
    # None: no retrieved contexts
    rebuild_texts: Callable[[], list[str] | None] | None = field(
        default=None, repr=False, compare=False
    )
    # the prompt of each call, in order (raises ContextUnavailable, saying why, when the
    # strategy sends none ragbench could rebuild)
    rebuild_prompts: Callable[[], list[str]] | None = field(default=None, repr=False, compare=False)

    def text(self) -> str | None:
        """The context the model read, as its prompt placed it (None: none). Raises
        ``ContextUnavailable`` when it cannot be rebuilt faithfully."""
        if self.rebuild_text is None:
            raise ContextUnavailable(f"strategy {self.strategy!r} declares no context to rebuild")
        return self.rebuild_text()

    def prompts(self) -> list[str]:
        """The prompt of each call the answer took, in order (the last one's reply is the
        answer). Raises ``ContextUnavailable`` when they cannot be rebuilt faithfully."""
        if self.rebuild_prompts is None:
            raise ContextUnavailable(f"strategy {self.strategy!r} declares no prompt to rebuild")
        return self.rebuild_prompts()

    def texts(self) -> list[str] | None:
        """The retrieved contexts the answer read, one text each, best first (None: none).
        Raises ``ContextUnavailable`` when they cannot be rebuilt faithfully."""
        return self.rebuild_texts() if self.rebuild_texts is not None else None


# ---------------------------------------------------------------------------- text(): as placed


def no_context(example: Example, record: Record, res: ResourcesFn) -> None:
    """Closed book: the model read no context."""
    return


def rag_context(example: Example, record: Record, res: ResourcesFn, decline: bool = False) -> str:
    """The retrieved chunks as the RAG prompt placed them (checked against the record's ids)."""
    prompt, rebuilt = rag_prompt(example, res(), record.params, decline=decline)
    same_retrieval(record, rebuilt)
    frame = prompt_format(example).frame(example, RETRIEVED_FRAME, decline, record.params.cot)
    return frame.context_of(prompt.removesuffix(frame.tail))


def long_context_context(
    example: Example, record: Record, res: ResourcesFn, decline: bool = False, meta_prefix: str = ""
) -> str:
    """The (possibly truncated) whole context (checked against the record's kept tokens)."""
    cot = getattr(record.params, "cot", False)  # Self-Route's long-context leg has none
    _, prefix, rebuilt = long_context_prompt(example, res(), record.params.overflow, decline, cot)
    same_cut(record, rebuilt, meta_prefix)
    return prompt_format(example).frame(example, FULL, decline, cot).context_of(prefix)


def self_route_context(example: Example, record: Record, res: ResourcesFn) -> str:
    """The context of the branch the record's ``route`` names (the RAG call offers the decline
    option, the long-context call does not)."""
    route = record.meta.get("route")
    if route == RETRIEVED:
        return rag_context(example, record, res, decline=True)
    if route == FULL_CONTEXT:
        return long_context_context(example, record, res, decline=False, meta_prefix="lc_")
    raise ContextUnavailable(f"self_route record without a known route ({route!r})")


def same_retrieval(record: Record, rebuilt: dict[str, Any]) -> None:
    """A rebuilt RAG prompt holds the chunks the record's did (``meta["retrieved"]``), or
    ``ContextUnavailable``."""
    retrieved = list(record.meta.get("retrieved") or [])
    if list(rebuilt["retrieved"]) != retrieved:
        raise ContextUnavailable(
            "retrieval now returns other chunks than the record's "
            f"({rebuilt['retrieved'][:3]}... vs {retrieved[:3]}...)"
        )


def same_cut(record: Record, rebuilt: dict[str, Any], meta_prefix: str = "") -> None:
    """A rebuilt long-context prompt keeps the tokens the record's did (``kept_tokens``, under
    ``meta_prefix`` for a router's long-context call), or ``ContextUnavailable``."""
    kept = record.meta.get(f"{meta_prefix}kept_tokens")
    if kept is not None and int(kept) != int(rebuilt["kept_tokens"]):
        raise ContextUnavailable(
            f"the context now keeps {rebuilt['kept_tokens']} tokens, the record {kept}"
        )


def pipeline_context(example: Example, record: Record, res: ResourcesFn) -> str | None:
    """The contexts a pipeline reported, as it recorded them (best first, blank-line separated);
    None when it reported none (a plain string answer: ``contexts`` None in its meta), so a judge
    does not judge it against an empty context. An empty list it did report reads as ""."""
    if "contexts" in record.meta and record.meta["contexts"] is None:
        return None
    return "\n\n".join(pipeline_contexts(example, record, res) or [])


# ---------------------------------------------------------------------------- texts(): one each


def pipeline_contexts(example: Example, record: Record, res: ResourcesFn) -> list[str] | None:
    """The contexts a pipeline returned, in its order (its ranking)."""
    if record.meta.get("contexts_truncated"):
        raise ContextUnavailable(
            "the record keeps the pipeline's contexts cut short (pipeline.MAX_CONTEXT_CHARS, "
            "MAX_CONTEXTS)"
        )
    items = record.meta.get("contexts") or []
    texts = [str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in items]
    return texts or None


def retrieved_contexts(example: Example, record: Record, res: ResourcesFn) -> list[str] | None:
    """The chunks a built-in RAG call placed in its prompt (``meta["retrieved"]``), best first."""
    ids = list(record.meta.get("retrieved") or [])
    return retrieved_texts(example, record.params, ids, res()) if ids else None


def retrieved_texts(example: Example, params: Any, ids: Sequence[str], res: Resources) -> list[str]:
    """Texts of the chunks ``ids`` of ``example``'s index under ``params`` (a ``RagParams``), in
    the retriever's rank order."""
    if res.index is None:
        raise ContextUnavailable("the run has no retrieval index to read the chunks from")
    chunks, retriever = res.index(example, params.retrieval())
    by_id = {c.id: c for c in chunks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ContextUnavailable(f"the index now has no chunk {missing[0]!r}")
    if getattr(params, "order", SCORE_ORDER) != SCORE_ORDER:
        k = min(len(chunks), params.top_k or MAX_CANDIDATES)
        rank: dict[str, int] = {}
        for r, scored in enumerate(retriever.retrieve([example.question], k)[0]):
            rank.setdefault(scored.chunk.id, r)
        if any(i not in rank for i in ids):
            raise ContextUnavailable("retrieval now ranks other chunks than the record's")
        ids = sorted(ids, key=rank.__getitem__)
    return [by_id[i].text for i in ids]


# ---------------------------------------------------------------------------- prompts(): as sent


def with_answer_step(example: Example, record: Record, first: str) -> list[str]:
    """``[first]``, and for a chain-of-thought record its answer step's prompt, built from the
    reasoning the record keeps (the first call's reply)."""
    if not getattr(record.params, "cot", False):
        return [first]
    reasoning = record.meta.get("cot_reasoning")
    if reasoning is None:
        raise ContextUnavailable(
            "the record keeps no reasoning (cot_reasoning) to build its answer step from"
        )
    return [first, prompt_format(example).cot_answer(example, str(reasoning))]


def closed_book_prompts(example: Example, record: Record, res: ResourcesFn) -> list[str]:
    """The question alone in the example's format (no resources needed)."""
    first = prompt_format(example).closed_book(example, record.params.cot)
    return with_answer_step(example, record, first)


def long_context_prompts(example: Example, record: Record, res: ResourcesFn) -> list[str]:
    """The whole context fitted as the run fitted it (checked against the kept tokens)."""
    params = record.params
    prompt, _, rebuilt = long_context_prompt(example, res(), params.overflow, cot=params.cot)
    same_cut(record, rebuilt)
    return with_answer_step(example, record, prompt)


def rag_prompts(example: Example, record: Record, res: ResourcesFn) -> list[str]:
    """The retrieved chunks in the RAG prompt (checked against the record's chunk ids)."""
    prompt, rebuilt = rag_prompt(example, res(), record.params)
    same_retrieval(record, rebuilt)
    return with_answer_step(example, record, prompt)


def self_route_prompts(example: Example, record: Record, res: ResourcesFn) -> list[str]:
    """The RAG call with the decline option and, when the record was routed, the long-context
    call after it."""
    prompt, rebuilt = rag_prompt(example, res(), record.params, decline=True)
    same_retrieval(record, rebuilt)
    route = record.meta.get("route")
    if route == RETRIEVED:
        return [prompt]
    if route != FULL_CONTEXT:
        raise ContextUnavailable(f"self_route record without a known route ({route!r})")
    lc_prompt, _, lc_rebuilt = long_context_prompt(example, res(), record.params.overflow)
    same_cut(record, lc_rebuilt, "lc_")
    return [prompt, lc_prompt]
