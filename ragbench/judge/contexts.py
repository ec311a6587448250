"""The contexts a record's answer read, one text per context, best first: what the context
metrics (``context_metrics``) judge one by one.

- A pipeline's record keeps them (``meta["contexts"]``: id, doc_id, span, text, score), in the
  order the pipeline returned them, which is taken as its ranking. A record whose texts were
  cut short (``meta["contexts_truncated"]``) cannot be judged faithfully: ``ContextUnavailable``.
- A built-in RAG record (``rag``; ``self_route``'s first call) keeps the ids of the chunks it
  placed in the prompt (``meta["retrieved"]``). Their texts come from the run's index, built
  again as the strategy built it (``Resources.index``: deterministic); an id the index no longer
  has is ``ContextUnavailable``. In rank order: with ``order: document`` the prompt holds them in
  source order, so the retriever is asked again for their ranks.
- Any other record (closed book, long context, retrieve only) has none: None.

Resources are asked for only when a record needs them (``resources`` is a thunk), so a judge
pass over pipeline records never loads the model under test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ragbench.strategies import ContextUnavailable, Resources
from ragbench.strategies.rag import MAX_CANDIDATES
from ragbench.types import Example, Record

SCORE_ORDER = "score"  # the context order in which a RAG prompt already is rank order


def record_contexts(
    example: Example, record: Record, resources: Callable[[], Resources]
) -> list[str] | None:
    """The context texts ``record`` read, best first (see the module docstring); None: none."""
    meta = record.meta
    if "contexts" in meta:
        if meta.get("contexts_truncated"):
            raise ContextUnavailable(
                "the record keeps the pipeline's contexts cut short (pipeline.MAX_CONTEXT_CHARS, "
                "MAX_CONTEXTS)"
            )
        items = meta.get("contexts") or []
        texts = [str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in items]
        return texts or None
    if meta.get("retrieved"):
        return retrieved_texts(example, record.params, list(meta["retrieved"]), resources())
    return None


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
