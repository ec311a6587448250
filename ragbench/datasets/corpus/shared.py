"""A shared corpus: one set of documents stored once, many questions asked over all of it.

The corpus file (``datasets.corpus_file``: ``write_documents``, ``read_documents``,
``corpus_fingerprint``) is what ``ragbench data docs`` writes.

Dataset ``corpus`` (``dataset: {name: corpus, params: {corpus: ..., questions: ...}}``): every
question of the questions file (``datasets.questions``) becomes an Example whose ``documents``
are the corpus, in corpus-file order, as one tuple object shared by every Example. So
long-context prompts are identical up to the question (one prefix KV, or a server's prefix
cache, serves them all) and nothing copies the corpus per question.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from ragbench.datasets.corpus.file import (
    corpus_fingerprint,
    read_documents,
    write_documents,
)
from ragbench.datasets.haystack import load_haystack, sentence_start_before
from ragbench.datasets.questions import read_questions, to_examples
from ragbench.io import atomic_write_text
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Document, Example

PathLike = str | os.PathLike


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
    cuts = [
        sentence_start_before(hay, offsets, hay_tokens * (i + 1) // (questions + 1))
        for i in range(questions)
    ]
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
        {
            "id": k,
            "question": f"What is the special magic number for {k}?",
            "answers": [v],
            "task_type": "needle",
        }
        for k, v in needles
    ]
    qpath = atomic_write_text(
        folder / "questions.jsonl", "".join(json.dumps(r) + "\n" for r in rows)
    )
    return corpus, qpath
