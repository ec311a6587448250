"""Dataset files: ragbench's own JSONL (read, write, fingerprint) and the ``IMPORTERS`` registry.

``load(fmt, path)`` imports a file with the importer ``IMPORTERS`` names for ``fmt``; every
importer returns ``list[Example]``. ``write_examples`` stores examples as canonical JSONL
(one ``Example.to_json()`` per line, written atomically) and ``fingerprint`` is the sha256 of
exactly those bytes, so a run that records it names the data it used.

Choices, per format:

- ``jsonl``: ragbench's own format, read strictly: unknown fields, wrong types (``answers`` is
  a list, even of one), duplicate example or document ids, ``meta.evidence`` spans outside their
  document and an empty question (unless ``meta.source`` names the task it was imported from:
  LongBench's summaries ask nothing) are errors.
- ``longbench``, ``ruler``, ``squad``: ``importers.py`` (its docstring gives each format's
  choices, and ``load_longbench``, ``load_ruler``, ``load_squad``, ``split_ruler_input``,
  ``UNANSWERABLE``).
- ``beir``: ``beir.py`` (the whole corpus stored once, each judged query an example over it).
- ``longbench-v2``, ``flashrag``, ``hf``: their own modules; also datasets under the same names.

Every malformed input raises one ``ragbench.io.InputFileError`` naming the file, line and field;
an input with no examples (an empty file, a BEIR split judging no query) is one too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ragbench.datasets._validate import (
    STRINGS,
    FieldError,
    check,
    document_from_row,
    no_unknown,
    nonempty,
    opt,
    read_jsonl,
    refuse_duplicate_ids,
    req,
)
from ragbench.io import atomic_write_text, dumps_canonical
from ragbench.registry import Registry
from ragbench.types import Document, Example

IMPORTERS = Registry(
    "dataset format",
    {
        "jsonl": "ragbench.datasets.formats:read_examples",
        "longbench": "ragbench.datasets.importers:load_longbench",
        "ruler": "ragbench.datasets.importers:load_ruler",
        "squad": "ragbench.datasets.importers:load_squad",
        "beir": "ragbench.datasets.beir:load_beir_examples",
        # importers that are datasets too (the same names in configs: ``datasets.DATASETS``)
        "longbench-v2": "ragbench.datasets.longbench_v2:load_longbench_v2",
        "flashrag": "ragbench.datasets.flashrag:load_flashrag",
        "hf": "ragbench.datasets.hf_local:load_hf",
    },
)

PathLike = str | os.PathLike


# --------------------------------------------------------------------------- public API


def load_file(path: str | os.PathLike, format: str = "jsonl", **options: object) -> list[Example]:
    """Examples from a file: ragbench JSONL by default, or an importer in ``IMPORTERS``."""
    return load(format, path, **options)


def load(fmt: str, path: PathLike, **options: object) -> list[Example]:
    """Import ``path`` in format ``fmt`` (one of ``IMPORTERS``); options go to the importer.
    An input that yields no examples is an error (a run, or a written 0-example file, would
    only fail later and further from the cause)."""
    examples = IMPORTERS.get(fmt)(path, **options)
    return nonempty(path, examples, "no examples (an empty file?)")


def _canonical_lines(examples: Iterable[Example]) -> Iterator[str]:
    """``e.to_json() + "\\n"`` for each example, each distinct ``documents`` tuple serialised
    once: questions over a shared corpus (``datasets.shared_corpus``) hold the same tuple, and
    serialising a large corpus again for every question would dominate the fingerprint.

    ``to_json`` is ``json.dumps(sort_keys=True, separators=(",", ":"))`` of ``to_dict``, which is
    the concatenation of each top-level key and value serialised alone, in key order; so the
    line is rebuilt from those parts and equals ``to_json`` byte for byte (a test checks)."""
    docs_json: dict[int, tuple[tuple[Document, ...], str]] = {}  # id -> (tuple kept alive, json)
    for e in examples:
        held = docs_json.get(id(e.documents))
        if held is None or held[0] is not e.documents:
            held = (e.documents, dumps_canonical([d.to_dict() for d in e.documents]))
            docs_json[id(e.documents)] = held
        rest = replace(e, documents=()).to_dict()  # documents: filled from the cache below
        parts = [
            f"{dumps_canonical(k)}:{held[1] if k == 'documents' else dumps_canonical(v)}"
            for k, v in sorted(rest.items())
        ]
        yield "{" + ",".join(parts) + "}\n"


def write_examples(path: PathLike, examples: Iterable[Example]) -> Path:
    """Atomically write canonical ragbench JSONL; duplicate example ids are refused."""
    examples = list(examples)
    refuse_duplicate_ids((e.id for e in examples), "example", "a file")
    return atomic_write_text(path, "".join(_canonical_lines(examples)))


def fingerprint(examples: Iterable[Example]) -> str:
    """sha256 of the canonical JSONL bytes: equals ``sha256_file`` of ``write_examples``' file.
    Streamed line by line, so a shared corpus is never held once per question in memory."""
    digest = hashlib.sha256()
    for line in _canonical_lines(examples):
        digest.update(line.encode("utf-8"))
    return digest.hexdigest()


def read_examples(path: PathLike, repeats: list[int] | None = None) -> list[Example]:
    """Read ragbench JSONL strictly (see the module docstring). With a ``repeats`` list, records
    repeated verbatim are skipped and their lines appended to it (``data dedup``)."""
    return read_jsonl(path, _example_from_row, id_field="id", repeats=repeats)


# --------------------------------------------------------------------------- ragbench JSONL

_EXAMPLE_KEYS = ("id", "question", "answers", "documents", "meta")


def _example_from_row(row: dict) -> Example:
    if "text" in row and "question" not in row:  # a document: a corpus file given for a dataset
        raise FieldError(
            ("text",),
            "this is a corpus file (a document a line, as `ragbench data docs` writes), not a "
            "ragbench dataset (an example a line: id, question, answers, documents); a corpus "
            "goes with a questions file into the `corpus` dataset",
        )
    no_unknown(row, _EXAMPLE_KEYS)
    docs: list[Document] = []
    for i, d in enumerate(req(row, "documents", list)):
        where = ("documents", i)
        doc = document_from_row(d, where)
        if any(doc.id == prev.id for prev in docs):
            raise FieldError(where + ("id",), f"duplicate document id {doc.id!r} in this example")
        docs.append(doc)
    meta = opt(row, "meta", dict, {})
    _check_evidence(meta.get("evidence"), {d.id: d for d in docs})
    question = req(row, "question", str)
    if not question.strip() and "source" not in meta:  # nothing to ask: every record would fail
        raise FieldError(  # imported tasks may ask nothing (LongBench summaries: meta.source)
            ("question",), "empty question; every example needs one"
        )
    return Example(
        id=req(row, "id", str),
        question=question,
        answers=tuple(req(row, "answers", STRINGS)),
        documents=tuple(docs),
        meta=meta,
    )


def _check_evidence(evidence: Any, docs: dict[str, Document]) -> None:
    if evidence is None:
        return
    check(evidence, list, ("meta", "evidence"))
    for i, span in enumerate(evidence):
        where = ("meta", "evidence", i)
        ok = isinstance(span, list) and len(span) == 3 and isinstance(span[0], str)
        if not ok or not all(isinstance(x, int) and not isinstance(x, bool) for x in span[1:]):
            raise FieldError(where, "expected [doc_id, start, end] (string, integer, integer)")
        doc_id, start, end = span
        if doc_id not in docs:
            raise FieldError(where, f"unknown document id {doc_id!r}; documents: {', '.join(docs)}")
        if not 0 <= start <= end <= len(docs[doc_id].text):
            n = len(docs[doc_id].text)
            raise FieldError(
                where, f"span {start}:{end} is outside document {doc_id!r} ({n} chars)"
            )
