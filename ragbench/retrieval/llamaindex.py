"""llama-index adapter: any ragbench ``Retriever`` as a llama-index ``BaseRetriever``.

This lets a ragbench retriever (dense, BM25, hybrid, rerank) drive llama-index query engines,
node postprocessors and response synthesizers unchanged::

    from llama_index.core.query_engine import RetrieverQueryEngine
    engine = RetrieverQueryEngine.from_args(RagbenchLlamaRetriever(retriever, k=5), llm=llm)

Each result is a ``NodeWithScore`` whose ``TextNode.id_`` is the ragbench chunk id, with the
source document id, character span and chunk meta in ``node.metadata``. This module imports
llama-index at import time: import it only where llama-index is wanted.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import (
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)

from ragbench.types import Chunk


class RagbenchLlamaRetriever(BaseRetriever):
    """Wrap ``retriever`` (a ``ragbench.retrieval.retrievers.Retriever``); ``k`` results a query."""

    def __init__(self, retriever: Any, k: int = 5, **kwargs: Any) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.retriever = retriever
        self.k = k
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = self.retriever.retrieve([query_bundle.query_str], self.k)[0]
        return [NodeWithScore(node=chunk_to_node(h.chunk), score=h.score) for h in hits]


def chunk_to_node(chunk: Chunk) -> TextNode:
    """A llama-index ``TextNode`` carrying the chunk's id, text, span and source document."""
    metadata = {"doc_id": chunk.doc_id, "start": chunk.start, "end": chunk.end, **chunk.meta}
    return TextNode(
        id_=chunk.id,
        text=chunk.text,
        start_char_idx=chunk.start,
        end_char_idx=chunk.end,
        metadata=metadata,
        # keep the prompt the LLM sees to the chunk text itself
        excluded_llm_metadata_keys=list(metadata),
        excluded_embed_metadata_keys=list(metadata),
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=chunk.doc_id)},
    )
