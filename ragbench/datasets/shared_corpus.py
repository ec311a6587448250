"""A shared corpus: one set of documents stored once, many questions asked over all of it.

Corpus file (what ``ragbench data docs`` writes): JSONL, one document per line, canonical JSON
(sorted keys, no spaces), in the corpus order::

    {"id":"guide.pdf","meta":{"format":"pdf","page_starts":[0,812],...},"text":"...","title":"..."}

``id`` and ``text`` are required, ``title`` and ``meta`` optional; other fields are errors. Ids
are unique. ``corpus_fingerprint`` is the sha256 of exactly the bytes ``write_documents`` writes,
so ``sha256sum corpus.jsonl`` names the same corpus.

Dataset ``corpus`` (``dataset: {name: corpus, params: {corpus: ..., questions: ...}}``): every
question of the questions file (``datasets.questions``) becomes an Example whose ``documents``
are the corpus, in corpus-file order, as one tuple object shared by every Example. So
long-context prompts are identical up to the question (one prefix KV, or a server's prefix
cache, serves them all) and nothing copies the corpus per question.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ragbench.datasets._validate import read_jsonl
from ragbench.io import InputFileError, atomic_write_text
from ragbench.types import Document, Example

PathLike = str | os.PathLike


def _lines(documents: Iterable[Document]) -> Iterator[str]:
    for d in documents:
        yield d.to_json() + "\n"


def write_documents(path: PathLike, documents: Iterable[Document]) -> Path:
    """Atomically write a corpus file; duplicate document ids are refused."""
    from ragbench.datasets.formats import refuse_duplicate_ids

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
    from ragbench.datasets.formats import document_from_row

    documents = read_jsonl(path, document_from_row, id_field="id")
    if not documents:
        raise InputFileError(path, None, "no documents (an empty corpus file)")
    return documents


def build(
    corpus: PathLike,
    questions: PathLike,
    task_type: str = "qa",
    missing_evidence: str = "warn",
) -> list[Example]:
    """The ``corpus`` dataset: each question of ``questions`` over all of ``corpus``.

    ``task_type`` is the instruction every question gets unless its own ``task_type`` says
    otherwise (so the prompt never depends on guessing); ``missing_evidence`` is ``warn``
    (an evidence quote not found in the corpus is logged with file and line, and the question
    kept without a span) or ``error``.
    """
    from ragbench.datasets.questions import read_questions, to_examples

    documents = tuple(read_documents(corpus))
    return to_examples(
        read_questions(questions),
        documents,
        questions,
        task_type=task_type,
        missing_evidence=missing_evidence,
        corpus_fingerprint=corpus_fingerprint(documents),
    )
