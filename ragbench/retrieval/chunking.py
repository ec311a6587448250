"""Split documents into retrievable chunks with llama-index-core node parsers.

Chunk size and overlap are counted in tokens of a named tokenizer (``ragbench.tokenizers``), so
"128-token chunks" means 128 tokens of the model that will read them. Every chunk keeps its
character span in its source document, and the invariant ``document.text[start:end] ==
chunk.text`` always holds (tested), so the evidence spans of an ``Example`` map to gold chunk ids
after any chunking (``gold_chunk_ids``).

Chunk ids are ``f"{doc_id}#{i}"`` (``i`` = position of the chunk in its document): stable across
runs for the same documents and chunking parameters, which are recorded in ``chunk.meta``.

Caveats:
- llama-index strips leading/trailing whitespace of each chunk, so the spans of consecutive
  chunks may skip the whitespace between them; overlapping chunks have overlapping spans.
- Token counts of llama-index splits are summed per split, and a tokenizer does not always give
  ``count(a + b) == count(a) + count(b)``: a chunk can be a token or two over ``chunk_size``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ragbench.retrieval.names import SPLITTERS
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Chunk, Document


def check_chunking(splitter: str, chunk_size: int, chunk_overlap: int) -> None:
    """Raise when ``splitter`` is not in ``SPLITTERS`` (did-you-mean) or the sizes do not fit:
    ``chunk_size >= 1`` and ``0 <= chunk_overlap < chunk_size`` tokens."""
    SPLITTERS.check(splitter)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
    if not 0 <= chunk_overlap < chunk_size:
        raise ValueError(
            f"chunk_overlap must be in [0, chunk_size={chunk_size}), got {chunk_overlap}"
        )


def make_splitter(splitter: str, chunk_size: int, chunk_overlap: int, encode: Callable):
    """The llama-index node parser for ``splitter``, counting tokens with ``encode``."""
    check_chunking(splitter, chunk_size, chunk_overlap)
    cls = SPLITTERS.get(splitter)
    return cls(chunk_size=chunk_size, chunk_overlap=chunk_overlap, tokenizer=encode)


def chunk_documents(
    documents: Sequence[Document],
    splitter: str,
    chunk_size: int,
    chunk_overlap: int,
    tokenizer: str,
) -> list[Chunk]:
    """Chunk ``documents`` in order; returns the chunks of the first document, then the next...

    ``splitter``: one of ``SPLITTERS``; ``chunk_size``/``chunk_overlap`` in tokens of
    ``tokenizer`` (a name for ``ragbench.tokenizers.get_tokenizer``; "whitespace" is fast).
    The defaults a run uses are ``config.RetrievalConfig``'s.
    Raises ValueError on an empty corpus, duplicate document ids or bad sizes.
    """
    documents = list(documents)
    if not documents:
        raise ValueError("cannot chunk an empty corpus: no documents given")
    _check_unique_ids(documents)
    from llama_index.core import Document as LIDocument

    parser = make_splitter(splitter, chunk_size, chunk_overlap, get_tokenizer(tokenizer).encode)
    params = {
        "splitter": splitter,
        "chunk_size": chunk_size,
        "chunk_overlap": chunk_overlap,
        "tokenizer": tokenizer,
    }
    chunks: list[Chunk] = []
    for doc in documents:
        if not doc.text.strip():
            continue
        # One document per call keeps the node order obvious; llama-index sets start/end_char_idx
        # by finding each chunk in the document text, we check it and fall back to our own search.
        nodes = _quiet_nodes(parser, LIDocument(text=doc.text, id_=doc.id))
        cursor = 0
        for i, node in enumerate(nodes):
            text = node.get_content()
            start, end = node.start_char_idx, node.end_char_idx
            if start is None or end is None or doc.text[start:end] != text:
                start, end = locate(doc.text, text, cursor)
            cursor = start + 1
            meta = {"index": i, **params}
            if doc.title:
                meta["title"] = doc.title
            chunks.append(Chunk(f"{doc.id}#{i}", doc.id, doc.text[start:end], start, end, meta))
    if not chunks:
        raise ValueError(f"cannot chunk an empty corpus: all {len(documents)} documents are blank")
    return chunks


def locate(text: str, piece: str, cursor: int = 0) -> tuple[int, int]:
    """Character span of ``piece`` in ``text`` at or after ``cursor`` (then anywhere).

    Exact match first; if a splitter normalised whitespace (joined words with " " where the
    document had a newline), match the same words separated by any whitespace. The caller then
    takes ``text[start:end]`` as the chunk text, so the span invariant holds exactly.
    """
    for origin in (cursor, 0):
        start = text.find(piece, origin)
        if start >= 0:
            return start, start + len(piece)
    words = piece.split()
    if words:
        pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
        match = pattern.search(text, cursor) or pattern.search(text)
        if match:
            return match.span()
    raise ValueError(f"chunk text not found in its document: {piece[:60]!r}...")


def gold_chunk_ids(chunks: Sequence[Chunk], evidence: Sequence[tuple[str, int, int]]) -> set[str]:
    """Ids of the chunks whose span overlaps an evidence span ``(doc_id, start, end)``.

    Spans are half-open ``[start, end)``; an empty evidence span ``start == end`` marks a point
    and matches the chunk that contains it. An evidence doc id with no chunk is an error (it
    would silently score recall 0).
    """
    by_doc: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    gold: set[str] = set()
    for doc_id, start, end in evidence:
        if end < start:
            raise ValueError(f"evidence span for {doc_id!r} ends before it starts: {start}>{end}")
        if doc_id not in by_doc:
            known = ", ".join(sorted(by_doc)[:10])
            raise ValueError(
                f"evidence names document {doc_id!r}, which has no chunks; known: {known}"
            )
        for chunk in by_doc[doc_id]:
            if start == end:
                hit = chunk.start <= start < chunk.end
            else:
                hit = chunk.start < end and start < chunk.end
            if hit:
                gold.add(chunk.id)
    return gold


def _check_unique_ids(documents: Sequence[Document]) -> None:
    seen: set[str] = set()
    for position, doc in enumerate(documents):
        if doc.id in seen:
            raise ValueError(f"duplicate document id {doc.id!r} at position {position}")
        seen.add(doc.id)


_METADATA_NOTE = re.compile(r"^Metadata length \(0\) is close to chunk size.*$\n?", re.M)


def _quiet_nodes(parser: Any, document: Any) -> list:
    """The parser's nodes. llama-index prints "Metadata length (0) is close to chunk size" for
    every document when chunks are under 50 tokens, even with no metadata at all (ours: a chunk
    size the user chose); that one line is dropped, any other output is passed on."""
    import contextlib
    import io
    import sys

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        nodes = parser.get_nodes_from_documents([document])
    rest = _METADATA_NOTE.sub("", buffer.getvalue())
    if rest:
        sys.stdout.write(rest)
    return nodes
