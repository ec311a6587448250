"""Corpus files (what ``ragbench data docs`` writes): JSONL, one document per line, canonical
JSON (sorted keys, no spaces), in the corpus order::

    {"id":"guide.pdf","meta":{"format":"pdf","page_starts":[0,812],...},"text":"...","title":"..."}

``id`` and ``text`` are required, ``title`` and ``meta`` optional; other fields are errors. Ids
are unique. ``corpus_fingerprint`` is the sha256 of exactly the bytes ``write_documents`` writes,
so ``sha256sum corpus.jsonl`` names the same corpus. The ``corpus`` dataset built from such a
file is ``datasets.shared_corpus``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ragbench.datasets._validate import document_from_row, read_jsonl, refuse_duplicate_ids
from ragbench.io import InputFileError, atomic_write_text
from ragbench.types import Document

PathLike = str | os.PathLike


def _lines(documents: Iterable[Document]) -> Iterator[str]:
    for d in documents:
        yield d.to_json() + "\n"


def write_documents(path: PathLike, documents: Iterable[Document]) -> Path:
    """Atomically write a corpus file; duplicate document ids are refused."""
    documents = list(documents)
    refuse_duplicate_ids((d.id for d in documents), "document", "a corpus")
    return atomic_write_text(path, "".join(_lines(documents)))


def corpus_fingerprint(documents: Iterable[Document]) -> str:
    """sha256 of the canonical corpus bytes: equals ``sha256_file`` of ``write_documents``."""
    digest = hashlib.sha256()
    for line in _lines(documents):
        digest.update(line.encode("utf-8"))
    return digest.hexdigest()


def read_documents(path: PathLike) -> list[Document]:
    """A corpus file, strictly: errors name the file, line and field; an empty file is one."""
    documents = read_jsonl(path, document_from_row, id_field="id")
    if not documents:
        raise InputFileError(path, None, "no documents (an empty corpus file)")
    return documents
