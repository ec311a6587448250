"""The llama-index adapter inside a real llama-index query pipeline (MockLLM, no network)."""

from __future__ import annotations

import pytest

from ragbench.retrieval.embedders.base import HashEmbedder
from ragbench.retrieval.retrievers import BM25Retriever, DenseRetriever, HybridRetriever
from ragbench.types import Chunk

CHUNKS = [
    Chunk("essay#0", "essay", "Startups grow fast when founders talk to users.", 0, 47),
    Chunk("essay#1", "essay", "The special magic number for Lisbon is 7463343.", 48, 95),
    Chunk("essay#2", "essay", "Painting and hacking are both kinds of making.", 96, 142),
    Chunk("notes#0", "notes", "Oslo is best enjoyed with a sandwich by the harbour.", 0, 52),
]
QUESTION = "What is the magic number for Lisbon?"


@pytest.fixture
def hybrid():
    return HybridRetriever([DenseRetriever(CHUNKS, HashEmbedder(dim=128)), BM25Retriever(CHUNKS)])


def test_nodes_carry_chunk_ids_scores_and_spans(hybrid):
    from ragbench.retrieval.llamaindex import RagbenchLlamaRetriever

    adapter = RagbenchLlamaRetriever(hybrid, k=2)
    nodes = adapter.retrieve(QUESTION)  # llama-index's public retrieve (callbacks, QueryBundle)
    expected = hybrid.retrieve([QUESTION], 2)[0]
    assert [n.node.id_ for n in nodes] == [h.chunk.id for h in expected]
    assert [n.score for n in nodes] == [h.score for h in expected]
    top = nodes[0].node
    assert top.id_ == "essay#1" and top.get_content() == CHUNKS[1].text
    assert (top.start_char_idx, top.end_char_idx, top.metadata["doc_id"]) == (48, 95, "essay")
    assert top.source_node.node_id == "essay"
    with pytest.raises(ValueError, match="k must be >= 1"):
        RagbenchLlamaRetriever(hybrid, k=0)


def test_inside_a_retriever_query_engine(hybrid):
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from ragbench.retrieval.llamaindex import RagbenchLlamaRetriever

    engine = RetrieverQueryEngine.from_args(RagbenchLlamaRetriever(hybrid, k=2), llm=MockLLM())
    response = engine.query(QUESTION)
    assert [n.node.id_ for n in response.source_nodes][0] == "essay#1"
    # MockLLM echoes its prompt: the synthesizer put the retrieved chunk and the question in it
    assert "7463343" in str(response) and QUESTION in str(response)
    used = {n.node.id_ for n in response.source_nodes}
    assert len(used) == 2
    for chunk in CHUNKS:  # exactly the retrieved chunks reached the prompt
        assert (chunk.text in str(response)) == (chunk.id in used)
    assert hybrid.num_queries >= 1
