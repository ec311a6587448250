"""BEIR import: the whole corpus stored once, each judged query an example over it (qrels in
its meta), and ``write_shared`` to store them as the ``corpus`` dataset's corpus + questions.

Each query with a judgement in the chosen qrels split (default: test, else dev, else train) becomes
an example over the *whole* corpus (one ``documents`` tuple shared by every example, in corpus-file
order, as the ``corpus`` dataset does; retrieval over only the judged documents would be trivial),
with ``meta["qrels"] = {doc_id: score}`` (every judged document), ``meta["evidence"]`` (the relevant
documents, score > 0, whole), ``meta["corpus_path"]`` and ``meta["corpus_fingerprint"]`` (what the
runner keys the one index by). BEIR has no answer strings, so ``answers=()``: score it with the
``retrieve_only`` strategy (recall/nDCG/MRR against the qrels). ``load_beir(path)`` returns the
corpus once plus queries and qrels in the BEIR ``{qid: {doc_id: score}}`` shape; ``write_shared``
stores examples over one corpus as a corpus file plus a questions file (``data import beir``).

(``formats.IMPORTERS`` names ``load_beir_examples`` as the ``beir`` format.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ragbench.datasets._validate import (
    nonempty,
    opt,
    read_jsonl,
    req,
)
from ragbench.datasets.corpus.file import corpus_fingerprint, write_documents
from ragbench.io import InputFileError, atomic_write_text, dumps_canonical, read_text
from ragbench.registry import unknown
from ragbench.types import Document, Example

BEIR_SPLITS = ("test", "dev", "train")  # default preference order for the qrels file
PathLike = str | os.PathLike


@dataclass(frozen=True)
class BeirData:
    """A BEIR dataset: the corpus once, queries, and qrels ``{qid: {doc_id: score}}``."""

    corpus: dict[str, Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    split: str
    corpus_path: Path


def load_beir(path: PathLike, split: str | None = None) -> BeirData:
    root = Path(path)
    if not root.is_dir():
        msg = "expected a BEIR folder holding corpus.jsonl, queries.jsonl and qrels/<split>.tsv"
        raise InputFileError(root, None, msg)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (root / name).is_file():
            raise InputFileError(root / name, None, "missing (required in a BEIR folder)")
    corpus = {d.id: d for d in read_jsonl(root / "corpus.jsonl", _beir_doc, id_field="_id")}
    queries = read_jsonl(root / "queries.jsonl", _beir_query, id_field="_id")
    qmap = {q.id: q.text for q in queries}
    qrels_file = _qrels_file(root, split)
    qrels = _read_qrels(qrels_file, qmap, corpus)
    return BeirData(corpus, qmap, qrels, qrels_file.stem, root / "corpus.jsonl")


def load_beir_examples(path: PathLike, split: str | None = None) -> list[Example]:
    """One example per judged query, each over the whole corpus (see the module docstring)."""
    data = load_beir(path, split)
    documents = tuple(data.corpus.values())  # one tuple, shared: never copied per question
    fingerprint = corpus_fingerprint(documents)
    examples = []
    for qid, question in data.queries.items():
        judged = data.qrels.get(qid)
        if not judged:
            continue
        relevant = [data.corpus[d] for d, score in judged.items() if score > 0]
        meta: dict[str, object] = {
            "source": "beir",
            "task": "beir",
            "split": data.split,
            "qrels": dict(judged),
        }
        meta |= {"corpus_path": str(data.corpus_path), "corpus_fingerprint": fingerprint}
        meta["evidence"] = [[d.id, 0, len(d.text)] for d in relevant]
        examples.append(Example(qid, question, (), documents, meta))
    qrels = data.corpus_path.parent / "qrels" / f"{data.split}.tsv"
    return nonempty(qrels, examples, "no judgements: no query can be scored")


# meta keys a questions file may not set (``datasets.questions.RESERVED_META``): ``write_shared``
# leaves them out, the ``corpus`` dataset sets them again
_SHARED_RESERVED = ("task", "task_type", "evidence", "evidence_quotes", "corpus_fingerprint")


def write_shared(
    examples: list[Example], corpus_path: PathLike, questions_path: PathLike
) -> tuple[Path, Path]:
    """Examples over one shared corpus as a corpus file plus a questions JSONL file (the
    ``corpus`` dataset's shape), so the corpus is stored once however many questions there are.
    Each question keeps its id, text, answers and meta (less the keys the ``corpus`` dataset
    sets itself); evidence spans are not kept (BEIR's judgements are in ``meta["qrels"]``)."""
    if not examples:
        raise ValueError("no examples to write")
    documents = examples[0].documents
    if any(e.documents is not documents and e.documents != documents for e in examples):
        raise ValueError("write_shared needs examples over one corpus (the same documents)")
    rows = []
    for e in examples:
        row: dict[str, object] = {"id": e.id, "question": e.question}
        if e.answers:
            row["answers"] = list(e.answers)
        meta = {k: v for k, v in e.meta.items() if k not in _SHARED_RESERVED}
        if meta:
            row["meta"] = meta
        rows.append(dumps_canonical(row) + "\n")
    corpus = write_documents(corpus_path, documents)
    return corpus, atomic_write_text(questions_path, "".join(rows))


def _beir_doc(row: dict) -> Document:
    meta = opt(row, "metadata", dict, {})
    title = opt(row, "title", str, "")
    return Document(id=req(row, "_id", str), text=req(row, "text", str), title=title, meta=meta)


def _beir_query(row: dict) -> Document:  # a Document is a handy (id, text) pair here
    return Document(id=req(row, "_id", str), text=req(row, "text", str))


def _qrels_file(root: Path, split: str | None) -> Path:
    available = sorted(p.stem for p in (root / "qrels").glob("*.tsv"))
    if split is None:
        split = next((s for s in BEIR_SPLITS if s in available), None)
        if split is None:
            msg = f"no qrels file; expected one of {', '.join(s + '.tsv' for s in BEIR_SPLITS)}"
            raise InputFileError(root / "qrels", None, msg)
    elif split not in available:
        raise unknown("BEIR split", split, available)
    return root / "qrels" / f"{split}.tsv"


def _qrels_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    for lineno, line in enumerate(read_text(path).split("\n"), start=1):  # file:line errors
        if line.strip():
            yield lineno, line.rstrip("\r").split("\t")


def _read_qrels(path: Path, queries: dict, corpus: dict) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for n, (lineno, cols) in enumerate(_qrels_rows(path)):
        if n == 0 and len(cols) == 3 and not re.fullmatch(r"-?\d+", cols[2].strip()):
            continue  # the header row (query-id, corpus-id, score)
        if len(cols) != 3:
            msg = f"expected 3 tab-separated columns (query-id, corpus-id, score), got {len(cols)}"
            raise InputFileError(path, lineno, msg, "columns")
        qid, did, score = (c.strip() for c in cols)
        if not re.fullmatch(r"-?\d+", score):
            raise InputFileError(path, lineno, f"expected an integer, got {score!r}", "score")
        if qid not in queries:
            raise InputFileError(path, lineno, f"unknown query id {qid!r}", "query-id")
        if did not in corpus:
            raise InputFileError(path, lineno, f"unknown document id {did!r}", "corpus-id")
        if did in qrels.setdefault(qid, {}):
            raise InputFileError(path, lineno, f"duplicate judgement of {did!r}", "corpus-id")
        qrels[qid][did] = int(score)
    return qrels
