"""Questions over a shared corpus: a CSV or JSONL file, validated with file:line:field errors.

Fields (JSONL keys, or CSV header columns; the format follows the extension, ``.csv`` or
``.jsonl``):

- ``question`` (required): the question text.
- ``id`` (optional): unique; default ``q1``, ``q2``, ... by position in the file (``q2-2``
  when another question's id is ``q2``: a default never takes an id the file writes).
- ``answers`` (optional): gold answers. JSONL: a list of strings (a single string is one
  answer); CSV: one cell, several answers separated by ``|``. Without answers a question is kept
  (for judge metrics, or to be reported unscored).
- ``evidence`` (optional): a quote from the corpus that supports the answer. JSONL: a string or
  a list of strings; CSV: one string. Each quote is located in the corpus (verbatim, else
  ignoring case and runs of whitespace, as PDF line breaks differ from what a person copies)
  and stored as ``[doc_id, start, end]`` spans in ``meta["evidence"]``, every occurrence in
  corpus order. A quote that is not found is reported with file and line.
- ``task_type`` (optional): the instruction the prompt gives, one of the prompt task types
  (``datasets.task_types.TASK_TYPES``: ``qa``, ``needle``); default: the dataset's.
- ``meta`` (JSONL only): an object added to the example's ``meta``.

Other fields or columns are errors naming the valid ones.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ragbench.datasets._validate import STRINGS, FieldError, check, json_type, no_unknown, opt, req
from ragbench.datasets.corpus.cleaning import clean_text
from ragbench.datasets.task_types import TASK_TYPES
from ragbench.io import InputFileError, iter_jsonl, read_text, require_file
from ragbench.registry import did_you_mean, unknown
from ragbench.types import Document, Example

log = logging.getLogger(__name__)

PathLike = str | os.PathLike
FIELDS = ("id", "question", "answers", "evidence", "task_type", "meta")
CSV_COLUMNS = ("id", "question", "answers", "evidence", "task_type")
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
MISSING_EVIDENCE = ("warn", "error")
ANSWER_SEPARATOR = "|"
# meta keys the dataset sets itself; a question's own meta may not override them
RESERVED_META = ("task", "task_type", "evidence", "evidence_quotes", "corpus_fingerprint")


@dataclass(frozen=True)
class Question:
    """One row of a questions file, validated; ``line`` is where it starts (for errors)."""

    question: str
    line: int
    id: str = ""
    answers: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    task_type: str = ""
    meta: dict[str, object] = field(default_factory=dict)


def task_types() -> tuple[str, ...]:
    return tuple(TASK_TYPES)


# --------------------------------------------------------------------------- reading


def read_questions(path: PathLike) -> list[Question]:
    """The questions of a CSV or JSONL file, ids filled in; duplicates name both lines."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise unknown("questions file extension", path.suffix or "(none)", FORMATS)
    require_file(path)
    rows = list(_csv_rows(path) if fmt == "csv" else _jsonl_rows(path))
    if not rows:
        raise InputFileError(path, None, "no questions (an empty questions file)")
    first: dict[str, int] = {}
    for q in rows:  # the ids the file writes first: a default never takes one of them
        if q.id in first:
            msg = f"duplicate id {q.id!r} (first on line {first[q.id]})"
            raise InputFileError(path, q.line, msg, "id")
        if q.id:
            first[q.id] = q.line
    return [q if q.id else _with_default_id(q, n, first) for n, q in enumerate(rows, start=1)]


def _with_default_id(q: Question, n: int, taken: dict[str, int]) -> Question:
    """``q`` (the ``n``-th question, without an id) with ``q{n}``, or, when the file gives
    another question that id, the first free ``q{n}-2``, ``q{n}-3``, ... (added to ``taken``)."""
    qid, k = f"q{n}", 1
    while qid in taken:
        k += 1
        qid = f"q{n}-{k}"
    taken[qid] = q.line
    return Question(**{**q.__dict__, "id": qid})


def _jsonl_rows(path: Path) -> Iterator[Question]:
    for lineno, row in iter_jsonl(path):
        try:
            yield _question_from_json(row, lineno)
        except FieldError as bad:
            raise InputFileError(path, lineno, bad.message, bad.field) from None


def _strings(row: dict, key: str) -> tuple[str, ...]:
    """A list of strings or one string (one item); empty strings dropped."""
    value = row.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    check(value, STRINGS, (key,))
    return tuple(v.strip() for v in value if v.strip())


def _question_from_json(row: dict, lineno: int) -> Question:
    no_unknown(row, FIELDS)
    question = req(row, "question", str).strip()
    if not question:
        raise FieldError(("question",), "empty question")
    qid = row.get("id")
    if qid is not None and not isinstance(qid, str):
        raise FieldError(("id",), f"expected a string, got {json_type(qid)}")
    return Question(
        question=question,
        line=lineno,
        id=(qid or "").strip(),
        answers=_strings(row, "answers"),
        evidence=_strings(row, "evidence"),
        task_type=_task_type(opt(row, "task_type", str, "").strip()),
        meta=_meta(opt(row, "meta", dict, {})),
    )


def _task_type(value: str, where: tuple = ("task_type",)) -> str:
    if value and value not in task_types():
        raise FieldError(where, str(unknown("task type", value, task_types())))
    return value


def _meta(meta: dict) -> dict:
    for key in RESERVED_META:
        if key in meta:
            raise FieldError(("meta", key), "reserved: the dataset sets this key itself")
    return meta


def _csv_rows(path: Path) -> Iterator[Question]:
    text = read_text(path)  # a byte order mark (Excel's "CSV UTF-8") is skipped
    # newline="": the csv module sees the file's own line ends (quoted cells may hold them)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    start = 1  # the line the next record starts on (a quoted cell may span lines)
    try:
        for cells in reader:
            line, start = start, reader.line_num + 1
            if not any(c.strip() for c in cells):
                continue
            if header is None:
                header = _csv_header(path, line, cells)
                continue
            if len(cells) != len(header):
                msg = f"expected {len(header)} columns ({', '.join(header)}), got {len(cells)}"
                raise InputFileError(path, line, msg)
            yield _question_from_csv(path, line, dict(zip(header, cells, strict=True)))
    except csv.Error as exc:
        raise InputFileError(path, reader.line_num, f"invalid CSV ({exc})") from None


def _csv_header(path: Path, line: int, cells: list[str]) -> list[str]:
    header = [c.strip() for c in cells]
    for name in header:
        if name not in CSV_COLUMNS:
            why = f"unknown column {name!r}; {did_you_mean(name, CSV_COLUMNS)}"
            if name == "meta":
                why = "a meta column needs JSON: use a JSONL questions file"
            raise InputFileError(path, line, why, "header")
        if header.count(name) > 1:
            raise InputFileError(path, line, f"column {name!r} appears twice", "header")
    if "question" not in header:
        msg = f"no 'question' column; columns: {', '.join(header)}"
        raise InputFileError(path, line, msg, "header")
    return header


def _question_from_csv(path: Path, line: int, row: dict[str, str]) -> Question:
    question = row["question"].strip()
    if not question:
        raise InputFileError(path, line, "empty question", "question")
    answers = row.get("answers", "").split(ANSWER_SEPARATOR)
    evidence = row.get("evidence", "").strip()
    try:
        task_type = _task_type(row.get("task_type", "").strip())
    except FieldError as bad:
        raise InputFileError(path, line, bad.message, bad.field) from None
    return Question(
        question=question,
        line=line,
        id=row.get("id", "").strip(),
        answers=tuple(a.strip() for a in answers if a.strip()),
        evidence=(evidence,) if evidence else (),
        task_type=task_type,
    )


# --------------------------------------------------------------------------- evidence


def _find_all(text: str, needle: str) -> Iterator[tuple[int, int]]:
    start = text.find(needle)
    while needle and start >= 0:
        yield start, start + len(needle)
        start = text.find(needle, start + len(needle))


def locate(quote: str, documents: Sequence[Document]) -> list[list[object]]:
    """``[doc_id, start, end]`` for every occurrence of ``quote`` in ``documents`` (in order):
    verbatim matches when there are any, else matches ignoring case and whitespace runs."""
    spans = [[d.id, s, e] for d in documents for s, e in _find_all(d.text, quote)]
    if spans:
        return spans
    words = clean_text(quote).split()
    if not words:
        return []
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words), re.IGNORECASE)
    return [[d.id, m.start(), m.end()] for d in documents for m in pattern.finditer(d.text)]


# --------------------------------------------------------------------------- examples


def to_examples(
    questions: Sequence[Question],
    documents: tuple[Document, ...],
    path: PathLike,
    *,
    task_type: str = "qa",
    missing_evidence: str = "warn",
    corpus_fingerprint: str = "",
) -> list[Example]:
    """One Example per question, all holding the same ``documents`` tuple (not a copy)."""
    if task_type not in task_types():
        raise unknown("task type", task_type, task_types())
    if missing_evidence not in MISSING_EVIDENCE:
        raise unknown("missing_evidence policy", missing_evidence, MISSING_EVIDENCE)
    out = []
    for q in questions:
        meta: dict[str, object] = {"task": "corpus", "task_type": q.task_type or task_type}
        if corpus_fingerprint:
            meta["corpus_fingerprint"] = corpus_fingerprint
        if q.evidence:
            spans = []
            for quote in q.evidence:
                found = locate(quote, documents)
                if not found:
                    _missing(path, q.line, quote, len(documents), missing_evidence)
                spans += found
            meta["evidence"] = spans
            meta["evidence_quotes"] = list(q.evidence)
        meta |= q.meta
        out.append(Example(q.id, q.question, q.answers, documents, meta))
    return out


def _missing(path: PathLike, line: int, quote: str, n_docs: int, policy: str) -> None:
    shown = quote if len(quote) <= 80 else quote[:77] + "..."
    msg = (
        f"quote not found in the corpus ({n_docs} documents; matched verbatim, then ignoring "
        f"case and whitespace): {shown!r}"
    )
    error = InputFileError(path, line, msg, "evidence")
    if policy == "error":
        raise error
    log.warning("%s; the question is kept without this evidence span", error)
