"""What a run folder keeps so its records can be read by people without the run's inputs: the
question texts (``questions.parquet``) and the text of every chunk a record points to
(``chunks.jsonl``, each chunk once, by ``ref``).

Records keep chunk *ids* (``meta["retrieved"]``, ``meta["gold_chunks"]``), which are only unique
inside one index: ``doc#3`` names another span under another chunk size, and another text when
two examples carry different documents under one id (a haystack with its needle elsewhere). So a
RAG record also keeps, beside each id, the chunk's ``ref`` (``retrieved_refs``, ``gold_refs``:
a hash of its document id and text) and its retrieval score (``retrieved_scores``); the texts
travel with the record in memory (``CHUNK_TEXTS`` in its meta, filled by ``rag_prompt``) and the
run folder's one writer moves them into ``chunks.jsonl`` before the record line that points to
them (``RecordWriter``), so a crash never leaves a record whose chunks are missing, and Ray
workers' records bring theirs with them. The view (``ragbench view``), ``ragbench diff`` and the
exports read these files; a folder written before them reads without (``read_questions`` and
``read_chunks`` return None, and the view says what is missing).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from ragbench.experiment.results import parquet_bytes
from ragbench.io import atomic_write_bytes, dumps_canonical
from ragbench.strategies.rag import CHUNK_TEXTS
from ragbench.types import Example

log = logging.getLogger(__name__)

QUESTIONS = "questions.parquet"
CHUNKS = "chunks.jsonl"


class ChunkJournal:
    """``chunks.jsonl`` of one run folder: append-only, one line per chunk, each ref once.
    Written only by the run folder's writer (it holds the lock)."""

    def __init__(self, out: Path) -> None:
        self.path = out / CHUNKS
        self.known: set[str] = set(read_chunks(out) or {})

    def take(self, meta: dict[str, Any], f: BinaryIO | None) -> dict[str, Any]:
        """``meta`` without its chunk texts; the texts not yet in the journal appended to ``f``
        (open on ``self.path``), flushed and fsynced, before the caller writes the record."""
        texts = meta.get(CHUNK_TEXTS)
        if texts is None:
            return meta
        new = {ref: v for ref, v in texts.items() if ref not in self.known}
        if new and f is not None:
            for ref, (doc_id, text) in sorted(new.items()):
                line = dumps_canonical({"ref": ref, "doc_id": doc_id, "text": text})
                f.write((line + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
            self.known.update(new)
        return {k: v for k, v in meta.items() if k != CHUNK_TEXTS}


def read_chunks(run_dir: Path | str) -> dict[str, dict[str, str]] | None:
    """``{ref: {"doc_id", "text"}}`` of a run folder (None: a folder written before chunk texts
    were kept). A torn last line (killed mid-write) is skipped."""
    path = Path(run_dir) / CHUNKS
    if not path.exists():
        return None
    out: dict[str, dict[str, str]] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            row = json.loads(line)
            out[str(row["ref"])] = {"doc_id": str(row["doc_id"]), "text": str(row["text"])}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s:%d: skipping unreadable chunk line (%s)", path, lineno, exc)
    return out


def write_questions(out: Path, examples: Iterable[Example]) -> None:
    """``questions.parquet``: per example its id, question, gold answers, its documents' ids and
    the documents its evidence lies in (``gold_docs``: the view's source-document filter)."""
    import pandas as pd

    rows = [
        {
            "example_id": e.id,
            "question": e.question,
            "answers": list(e.answers),
            "doc_ids": [d.id for d in e.documents],
            "gold_docs": sorted({d for d, _, _ in e.evidence}),
        }
        for e in examples
    ]
    columns = ["example_id", "question", "answers", "doc_ids", "gold_docs"]
    atomic_write_bytes(out / QUESTIONS, parquet_bytes(pd.DataFrame(rows, columns=columns)))


def read_questions(run_dir: Path | str) -> Any:
    """The run folder's questions table (None: written before questions were kept)."""
    import pandas as pd

    path = Path(run_dir) / QUESTIONS
    return pd.read_parquet(path) if path.exists() else None
