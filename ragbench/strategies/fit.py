"""The whole context fitted to the window: the long-context prompt (document first, question
last) under an ``overflow`` policy, shared by long context, Self-Route's long-context branch, the
preload and the judge's context rebuild.

Many questions over one shared corpus (``meta["corpus_fingerprint"]``) get the same context,
fitted once per run against a fixed reserve for the question (``QUESTION_RESERVE`` tokens)
rather than against each question's length: otherwise every question would cut the corpus at a
different token and no prefix cache could serve two of them.

A record says what a cut kept (``kept_facts``): ``truncated_tokens``, the ids of the documents
``dropped_documents`` entirely and ``cut_documents`` in part, and ``evidence_truncated`` (whether
the example's evidence spans lie outside the kept text; None without spans), which failure
attribution reads. Self-Route's long-context branch stores the same keys with an ``lc_`` prefix."""

from __future__ import annotations

from collections.abc import Sequence

from ragbench.llm.base import ContextOverflowError
from ragbench.strategies.base import Resources
from ragbench.strategies.prompt_format import FULL, Frame, prompt_format
from ragbench.strategies.prompts import OVERFLOW_ERROR, kept_ranges
from ragbench.types import DOCUMENT_SEPARATOR, Document, Example

QUESTION_RESERVE = 256  # tokens kept free for the question when a shared corpus must be cut


def long_context_prompt(
    example: Example,
    res: Resources,
    overflow: str = OVERFLOW_ERROR,
    decline: bool = False,
    cot: bool = False,
) -> tuple[str, str, dict[str, object]]:
    """(prompt, prefix, meta) with the context fitted to the limit under ``overflow``, in the
    example's prompt format (``cot``: its reasoning call's prompt, with that call's budget);
    the meta says what the cut kept (``kept_facts``)."""
    fmt = prompt_format(example)
    frame = fmt.frame(example, FULL, decline, cot)
    new_tokens = res.new_tokens(fmt, cot)
    shared = example.meta.get("corpus_fingerprint")
    if shared:
        key = (str(shared), overflow, frame.head, frame.separator, new_tokens)
        if key not in res.fitted:
            reserve = frame.with_tail("x " * QUESTION_RESERVE)  # a question of the reserved length
            res.fitted[key] = _fit(example, res, reserve, overflow, new_tokens)
        kept, context_tokens, ranges = res.fitted[key]
    else:
        kept, context_tokens, ranges = _fit(example, res, frame, overflow, new_tokens)
    if res.excess(kept, frame, new_tokens) > 0:  # a question over the reserve (or the budget)
        raise ContextOverflowError(
            res.prompt_tokens(frame.prompt(kept)),
            new_tokens,
            res.limit(new_tokens) + new_tokens,
            getattr(res.llm, "name", "llm"),
        )
    kept_tokens = res.llm.count_tokens(kept)
    meta = {
        "input_context_tokens": context_tokens,
        "kept_tokens": kept_tokens,
        "truncated_tokens": context_tokens - kept_tokens,
        **kept_facts(example, ranges),
    }
    return frame.prompt(kept), frame.prefix(kept), meta


def _fit(
    example: Example, res: Resources, frame: Frame, overflow: str, new_tokens: int
) -> tuple[str, int, list[tuple[int, int]]]:
    """(the context kept in ``frame`` under ``overflow``, the context's own token count, the
    kept character ranges of the context)."""
    context = example.context
    available = res.room(frame, new_tokens)
    context_tokens = res.llm.count_tokens(context)
    if context_tokens <= available:
        return context, context_tokens, [(0, len(context))]
    if overflow == OVERFLOW_ERROR:
        raise ContextOverflowError(
            context_tokens + res.prompt_tokens(frame.prompt("")),
            new_tokens,
            res.limit(new_tokens) + new_tokens,
            getattr(res.llm, "name", "llm"),
        )
    ranges = kept_ranges(context, available, overflow, res.llm.count_tokens)
    # Tokens can merge across the joins with the frame, so measure the real prompt and cut
    # again by the excess until it fits (usually once, by one token).
    while ranges and (excess := res.excess(_text(context, ranges), frame, new_tokens)) > 0:
        available -= excess
        ranges = kept_ranges(context, available, overflow, res.llm.count_tokens)
    return _text(context, ranges), context_tokens, ranges


def _text(context: str, ranges: list[tuple[int, int]]) -> str:
    return "".join(context[s:e] for s, e in ranges)


def document_layout(documents: Sequence[Document]) -> list[tuple[str, int, int, int]]:
    """Where each document sits in ``join_documents``' text: (id, start of its part, start of
    its text after the title line, end), in order."""
    out, pos = [], 0
    for doc in documents:
        head = len(doc.title) + 1 if doc.title else 0  # "title\ntext"
        out.append((doc.id, pos, pos + head, pos + head + len(doc.text)))
        pos += head + len(doc.text) + len(DOCUMENT_SEPARATOR)
    return out


def kept_facts(example: Example, ranges: list[tuple[int, int]]) -> dict[str, object]:
    """What a cut to ``ranges`` (kept character ranges of ``example.context``) kept:
    ``dropped_documents`` (ids with nothing kept) and ``cut_documents`` (ids partly kept), in
    document order, and ``evidence_truncated``: True when some evidence span
    (``example.evidence``) is not wholly inside the kept text, False when every one is, None
    when the example has no evidence spans (in its documents) to tell."""

    def kept(start: int, end: int) -> int:  # characters of [start, end) inside the ranges
        return sum(max(0, min(end, e) - max(start, s)) for s, e in ranges)

    dropped: list[str] = []
    cut: list[str] = []
    text_at: dict[str, int] = {}  # document id -> where its text starts
    for doc_id, start, text_start, end in document_layout(example.documents):
        text_at.setdefault(doc_id, text_start)
        if end > start and kept(start, end) == 0:
            dropped.append(doc_id)
        elif kept(start, end) < end - start:
            cut.append(doc_id)
    spans = [(text_at[d] + s, text_at[d] + e) for d, s, e in example.evidence if d in text_at]
    inside = [any(s <= a and b <= e for s, e in ranges) for a, b in spans]
    return {
        "dropped_documents": dropped,
        "cut_documents": cut,
        "evidence_truncated": (not all(inside)) if spans else None,
    }
