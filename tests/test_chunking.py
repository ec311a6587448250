"""Chunking: llama-index splitters, token sizes, exact character spans, gold chunk ids."""

from __future__ import annotations

import random

import pytest

from ragbench.registry import UnknownNameError
from ragbench.retrieval.chunking import chunk_documents, gold_chunk_ids, locate
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Chunk, Document

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "pi",
    "rho",
]


def make_text(seed: int, sentences: int = 60) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(sentences):
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
        out.append(sentence.capitalize() + ".")
        if i % 7 == 6:
            out.append("\n\n")  # paragraphs, so whitespace between chunks is not just " "
    return " ".join(out)


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    return [Document(f"d{i}", make_text(i), title=f"Doc {i}") for i in range(3)]


@pytest.mark.parametrize("splitter", ["sentence", "token"])
def test_spans_are_exact_and_sizes_respected(docs, splitter):
    chunks = chunk_documents(docs, splitter, chunk_size=40, chunk_overlap=8, tokenizer="whitespace")
    texts = {d.id: d.text for d in docs}
    tok = get_tokenizer("whitespace")
    assert len(chunks) > 3 * len(docs)
    for chunk in chunks:
        assert texts[chunk.doc_id][chunk.start : chunk.end] == chunk.text
        assert chunk.text.strip() == chunk.text and chunk.text
        assert tok.count(chunk.text) <= 40
        assert chunk.meta["splitter"] == splitter and chunk.meta["chunk_size"] == 40
    # every word of every document is covered by some chunk, in order within a document
    for doc in docs:
        mine = [c for c in chunks if c.doc_id == doc.id]
        assert [c.id for c in mine] == [f"{doc.id}#{i}" for i in range(len(mine))]
        assert [c.start for c in mine] == sorted(c.start for c in mine)
        covered = set()
        for c in mine:
            covered.update(range(c.start, c.end))
        assert all(i in covered for i, ch in enumerate(doc.text) if not ch.isspace())


def test_overlap_shares_text_and_ids_are_stable(docs):
    a = chunk_documents(docs, "token", chunk_size=30, chunk_overlap=10, tokenizer="whitespace")
    b = chunk_documents(docs, "token", chunk_size=30, chunk_overlap=10, tokenizer="whitespace")
    assert a == b  # same ids, texts and spans on a rerun
    overlapping = [
        (x, y) for x, y in zip(a, a[1:], strict=False) if x.doc_id == y.doc_id and y.start < x.end
    ]
    assert len(overlapping) >= len(a) // 2
    no_overlap = chunk_documents(
        docs, "token", chunk_size=30, chunk_overlap=0, tokenizer="whitespace"
    )
    assert len(no_overlap) < len(a)


def test_larger_chunks_give_fewer_chunks(docs):
    small = chunk_documents(docs, "sentence", 30, 0, tokenizer="whitespace")
    large = chunk_documents(docs, "sentence", 120, 0, tokenizer="whitespace")
    assert len(large) < len(small)
    assert Chunk.from_json(large[0].to_json()) == large[0]


@pytest.mark.slow
def test_real_tokenizer_counts_tokens(docs):
    tok = get_tokenizer("smollm2-135m-instruct")
    chunks = chunk_documents(docs, "sentence", 64, 8, "smollm2-135m-instruct")
    counts = [tok.count(c.text) for c in chunks]
    assert max(counts) <= 64 + 2  # see the module docstring: counts are summed per split
    assert sum(counts) / len(counts) > 32  # chunks are packed, not one sentence each
    texts = {d.id: d.text for d in docs}
    assert all(texts[c.doc_id][c.start : c.end] == c.text for c in chunks)


def test_bad_input_errors(docs):
    with pytest.raises(UnknownNameError, match="did you mean 'sentence'.*valid: sentence, token"):
        chunk_documents(docs, "sentense", 128, 16, tokenizer="whitespace")
    with pytest.raises(ValueError, match="empty corpus"):
        chunk_documents([], "sentence", 128, 16, tokenizer="whitespace")
    with pytest.raises(ValueError, match="all 1 documents are blank"):
        chunk_documents([Document("x", "  \n")], "sentence", 128, 16, "whitespace")
    with pytest.raises(ValueError, match="duplicate document id 'd0' at position 1"):
        chunk_documents([docs[0], docs[0]], "sentence", 128, 16, "whitespace")
    with pytest.raises(ValueError, match="chunk_overlap"):
        chunk_documents(docs, "sentence", 10, 10, tokenizer="whitespace")
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_documents(docs, "sentence", 0, 0, tokenizer="whitespace")


def test_blank_documents_are_skipped(docs):
    chunks = chunk_documents([Document("empty", ""), docs[0]], "sentence", 128, 16, "whitespace")
    assert {c.doc_id for c in chunks} == {"d0"}


def test_locate_exact_then_whitespace_tolerant():
    text = "one two\nthree four. one two\nthree four."
    assert locate(text, "one two\nthree", 0) == (0, 13)
    assert locate(text, "one two\nthree", 1) == (20, 33)  # next occurrence after the cursor
    start, end = locate(text, "two three four.", 0)  # a splitter joined lines with " "
    assert text[start:end] == "two\nthree four."
    with pytest.raises(ValueError, match="not found"):
        locate(text, "five six", 0)


def test_gold_chunk_ids_maps_evidence_after_any_chunking(docs):
    doc = docs[1]
    needle = "Needle sentence with the magic number 7463343."
    at = doc.text.index(". ", len(doc.text) // 2) + 2
    text = doc.text[:at] + needle + " " + doc.text[at:]
    d = Document("n", text)
    evidence = [("n", at, at + len(needle))]
    for size, splitter in [(20, "token"), (40, "sentence"), (80, "sentence")]:
        chunks = chunk_documents([d, docs[0]], splitter, size, 4, tokenizer="whitespace")
        gold = gold_chunk_ids(chunks, evidence)
        assert gold, (size, splitter)
        by_id = {c.id: c for c in chunks}
        # gold chunks overlap the needle, the others do not
        assert all(by_id[g].start < at + len(needle) and at < by_id[g].end for g in gold)
        assert "7463343" in " ".join(by_id[g].text for g in gold)
        rest = [c for c in chunks if c.id not in gold and c.doc_id == "n"]
        assert all(c.end <= at or c.start >= at + len(needle) for c in rest)
        assert all(g.startswith("n#") for g in gold)


def test_gold_chunk_ids_edges():
    chunks = [Chunk("a#0", "a", "x" * 10, 0, 10), Chunk("a#1", "a", "y" * 10, 10, 20)]
    assert gold_chunk_ids(chunks, [("a", 10, 12)]) == {"a#1"}  # half-open spans
    assert gold_chunk_ids(chunks, [("a", 8, 12)]) == {"a#0", "a#1"}
    assert gold_chunk_ids(chunks, [("a", 10, 10)]) == {"a#1"}  # a point
    assert gold_chunk_ids(chunks, [("a", 25, 30)]) == set()
    assert gold_chunk_ids(chunks, []) == set()
    with pytest.raises(ValueError, match="'b', which has no chunks; known: a"):
        gold_chunk_ids(chunks, [("b", 0, 1)])
    with pytest.raises(ValueError, match="ends before it starts"):
        gold_chunk_ids(chunks, [("a", 5, 1)])


def test_small_chunks_print_no_llama_index_metadata_note(capsys):
    # llama-index prints "Metadata length (0) is close to chunk size" per document under 50
    # tokens, with no metadata at all: noise in every notebook cell that chunks
    from ragbench.retrieval.chunking import chunk_documents

    docs = [Document(f"d{i}", "word " * 300) for i in range(3)]
    chunks = chunk_documents(docs, "sentence", 32, 4, "whitespace")
    assert len(chunks) > 3 and "Metadata length" not in capsys.readouterr().out
