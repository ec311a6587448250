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


_KEY_WORDS = ("amber", "birch", "cedar", "delta", "ember", "fjord", "granite", "harbor")


def write_essay_corpus(
    folder: PathLike,
    questions: int = 50,
    tokens: int = 4000,
    documents: int = 5,
    tokenizer: str = "smollm2-135m-instruct",
    seed: int = 0,
) -> tuple[Path, Path]:
    """A shared corpus for benchmarks and demos, offline: the first ``tokens`` tokens (of
    ``tokenizer``) of the embedded essays split into ``documents`` documents, with ``questions``
    keyed needles ("The special magic number for <key> is <7 digits>.") at evenly spaced sentence
    starts, and one question per needle. Writes ``corpus.jsonl`` and ``questions.jsonl`` into
    ``folder``; returns their paths. Deterministic for a ``seed``."""
    import json
    import random

    from ragbench.datasets.haystack import load_haystack, sentence_start_before
    from ragbench.tokenizers import get_tokenizer

    rng = random.Random(seed)
    tok = get_tokenizer(tokenizer)
    needles = [
        (f"{rng.choice(_KEY_WORDS)}-{i}", str(rng.randrange(1_000_000, 10_000_000)))
        for i in range(questions)
    ]
    texts = [f" The special magic number for {k} is {v}. " for k, v in needles]
    hay_tokens = tokens - sum(tok.count(t) for t in texts)
    if hay_tokens < questions:
        raise ValueError(f"{tokens} tokens leave no room for the essays beside {questions} needles")
    hay, offsets = load_haystack("essays").take(tok, hay_tokens)
    cuts = [sentence_start_before(hay, offsets, hay_tokens * (i + 1) // (questions + 1))
            for i in range(questions)]  # fmt: skip
    pieces, start = [], 0
    for cut, needle in zip(cuts, texts, strict=True):
        pieces.append(hay[start:cut].strip() + needle)
        start = cut
    pieces[-1] += hay[start:].strip()
    size = -(-len(pieces) // documents)  # ceiling: needles per document
    docs = [
        Document(f"essays-{j}.txt", "".join(pieces[i : i + size]).strip())
        for j, i in enumerate(range(0, len(pieces), size))
    ]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    corpus = write_documents(folder / "corpus.jsonl", docs)
    rows = [
        {"id": k, "question": f"What is the special magic number for {k}?", "answers": [v],
         "task_type": "needle"}
        for k, v in needles
    ]  # fmt: skip
    qpath = atomic_write_text(
        folder / "questions.jsonl", "".join(json.dumps(r) + "\n" for r in rows)
    )
    return corpus, qpath
