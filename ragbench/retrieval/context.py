"""Context assembly: fit retrieved chunks into the token budget of the LLM that will read them.

``assemble_context`` is a pure function: retrieved chunks (in rank order, as a retriever returns
them) plus a token counter in, the context text plus its accounting out. Chunks are taken greedily
in rank order; a chunk that would push the context over ``budget`` is skipped (a smaller,
lower-ranked chunk may still fit). The budget is checked on the exact final text (markers and
separators included), because token counts of a concatenation are not the sum of the parts for
BPE tokenizers.

Two orders of the chosen chunks in the text:

- ``"score"``: best first (the usual RAG prompt);
- ``"document"``: the order they have in the source, documents by ``doc_order`` (default: by
  their best-ranked chunk) then by start offset: order-preserving RAG, which keeps a narrative's
  sequence and helps small models.

With ``cite=True`` each chunk is prefixed by a citation marker ``[1]``, ``[2]``, ... numbered in
text order; ``chunk_ids[i]`` is the chunk cited as ``[i + 1]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragbench.registry import Choice, Registry
from ragbench.types import Chunk, ScoredChunk

ORDERS = Registry(
    "context order",
    {
        "score": Choice("chunks best first, as the retriever ranked them"),
        "document": Choice(
            "chunks in source order (documents by best chunk): order-preserving RAG"
        ),
    },
)


@dataclass(frozen=True)
class AssembledContext:
    text: str
    chunk_ids: tuple[str, ...]  # in text order; chunk_ids[i] is cited as [i + 1]
    tokens: int  # count_tokens(text)
    dropped: tuple[str, ...]  # input chunk ids left out (over budget or past top_k), input order


def assemble_context(
    scored: Sequence[ScoredChunk],
    count_tokens: Callable[[str], int],
    budget: int | None = None,
    top_k: int | None = None,
    order: str = "score",
    separator: str = "\n\n",
    cite: bool = True,
    doc_order: Sequence[str] | None = None,
    marker: str = "[{n}] ",
) -> AssembledContext:
    """Join the best chunks of ``scored`` into at most ``budget`` tokens of ``count_tokens``.

    ``top_k`` caps the number of candidates (the first ``top_k`` of ``scored``); ``budget=None``
    means no token limit. ``doc_order`` lists document ids in their original order for
    ``order="document"``. ``marker`` is the citation marker (``{n}``: the chunk's number in
    text order), used when ``cite`` is true.
    """
    ORDERS.check(order)
    if budget is not None and budget < 0:
        raise ValueError(f"token budget must be >= 0, got {budget}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")

    first: dict[str, Chunk] = {}  # first occurrence of each id (duplicates ignored), rank order
    for sc in list(scored)[:top_k]:
        first.setdefault(sc.chunk.id, sc.chunk)
    candidates = list(first.values())

    rank_of = {c.id: r for r, c in enumerate(candidates)}
    doc_key = _doc_positions(candidates, doc_order)

    def arrange(chosen: list[Chunk]) -> list[Chunk]:
        if order == "score":
            return sorted(chosen, key=lambda c: rank_of[c.id])
        return sorted(chosen, key=lambda c: (doc_key[c.doc_id], c.start, c.end, rank_of[c.id]))

    def render(chunks: list[Chunk]) -> str:
        blocks = [marker.format(n=i + 1) + c.text if cite else c.text for i, c in enumerate(chunks)]
        return separator.join(blocks)

    chosen: list[Chunk] = []
    text, tokens = "", 0
    for chunk in candidates:
        trial = arrange([*chosen, chunk])
        trial_text = render(trial)
        trial_tokens = count_tokens(trial_text)
        if budget is not None and trial_tokens > budget:
            continue
        chosen, text, tokens = trial, trial_text, trial_tokens

    used = {c.id for c in chosen}
    dropped = dict.fromkeys(sc.chunk.id for sc in scored if sc.chunk.id not in used)
    return AssembledContext(
        text=text, chunk_ids=tuple(c.id for c in chosen), tokens=tokens, dropped=tuple(dropped)
    )


def _doc_positions(candidates: list[Chunk], doc_order: Sequence[str] | None) -> dict[str, int]:
    """Document id -> sort position: ``doc_order`` first, then unseen docs by best rank."""
    positions: dict[str, int] = {}
    for doc_id in doc_order or ():
        positions.setdefault(doc_id, len(positions))
    for chunk in candidates:
        positions.setdefault(chunk.doc_id, len(positions))
    return positions
