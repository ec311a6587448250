"""Context assembly: exact texts, budgets, orders and citation markers."""

from __future__ import annotations

import pytest

from ragbench.retrieval.context import assemble_context
from ragbench.types import Chunk, ScoredChunk


def words(text: str) -> int:
    return len(text.split())


def sc(cid: str, doc: str, start: int, text: str, score: float) -> ScoredChunk:
    return ScoredChunk(Chunk(cid, doc, text, start, start + len(text)), score)


# rank order as a retriever returns it: b#1, a#2, a#0, b#0
RANKED = [
    sc("b#1", "b", 50, "beta one two", 0.9),  # 3 words
    sc("a#2", "a", 90, "alpha two x y z w", 0.8),  # 6 words
    sc("a#0", "a", 0, "alpha zero", 0.7),  # 2 words
    sc("b#0", "b", 0, "beta zero", 0.6),  # 2 words
]


def test_score_order_with_citations_no_budget():
    ctx = assemble_context(RANKED, words)
    assert ctx.text == (
        "[1] beta one two\n\n[2] alpha two x y z w\n\n[3] alpha zero\n\n[4] beta zero"
    )
    assert ctx.chunk_ids == ("b#1", "a#2", "a#0", "b#0")
    assert ctx.tokens == 4 + 7 + 3 + 3
    assert ctx.dropped == ()


def test_budget_skips_a_chunk_that_does_not_fit_and_keeps_filling():
    # b#1 costs 4 ([1] + 3 words); a#2 would bring it to 11 > 8, skipped; a#0 -> 7; b#0 -> 10 > 8
    ctx = assemble_context(RANKED, words, budget=8)
    assert ctx.chunk_ids == ("b#1", "a#0")
    assert ctx.text == "[1] beta one two\n\n[2] alpha zero"
    assert ctx.tokens == 7 <= 8
    assert ctx.dropped == ("a#2", "b#0")


def test_document_order_sorts_by_doc_then_offset_and_renumbers_markers():
    ctx = assemble_context(RANKED, words, order="document", doc_order=["a", "b"], cite=True)
    assert ctx.chunk_ids == ("a#0", "a#2", "b#0", "b#1")
    assert ctx.text.startswith("[1] alpha zero\n\n[2] alpha two")
    assert ctx.text.endswith("[3] beta zero\n\n[4] beta one two")
    # without doc_order, documents are ordered by their best-ranked chunk (b first)
    ctx = assemble_context(RANKED, words, order="document")
    assert ctx.chunk_ids == ("b#0", "b#1", "a#0", "a#2")


def test_top_k_separator_and_no_citations():
    ctx = assemble_context(RANKED, words, top_k=2, separator=" | ", cite=False)
    assert ctx.text == "beta one two | alpha two x y z w"
    assert ctx.tokens == 3 + 1 + 6  # the separator "|" is a word too
    assert ctx.dropped == ("a#0", "b#0")


def test_budget_counts_the_exact_final_text():
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return len(text)  # characters as tokens: separators and markers cost

    ctx = assemble_context(RANKED, counting, budget=len("[1] beta one two"))
    assert ctx.chunk_ids == ("b#1",) and ctx.tokens == len(ctx.text)
    assert calls[-1].startswith("[1] beta one two\n\n")  # later chunks were tried and refused


def test_edge_cases():
    empty = assemble_context([], words, budget=10)
    assert (empty.text, empty.chunk_ids, empty.tokens, empty.dropped) == ("", (), 0, ())
    nothing_fits = assemble_context(RANKED, words, budget=1)
    assert nothing_fits.chunk_ids == () and nothing_fits.dropped == tuple(
        s.chunk.id for s in RANKED
    )
    dup = assemble_context([RANKED[0], RANKED[0], RANKED[2]], words)
    assert dup.chunk_ids == ("b#1", "a#0")
    with pytest.raises(ValueError, match="did you mean 'document'"):
        assemble_context(RANKED, words, order="documents")
    with pytest.raises(ValueError, match="budget must be >= 0"):
        assemble_context(RANKED, words, budget=-1)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        assemble_context(RANKED, words, top_k=0)


def test_with_a_real_tokenizer_budget_is_respected():
    from ragbench.tokenizers import get_tokenizer

    tok = get_tokenizer("whitespace")
    ctx = assemble_context(RANKED, tok.count, budget=9, order="document", doc_order=["a", "b"])
    assert ctx.tokens == tok.count(ctx.text) <= 9
