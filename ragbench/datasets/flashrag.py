"""FlashRAG import: one split file of questions over one shared corpus file.

FlashRAG (RUC-NLPIR/FlashRAG) ships 36 QA datasets (NQ, TriviaQA, HotpotQA, 2Wiki, MuSiQue,
ASQA, ...) in one format (its README, "Datasets"; ``FlashRAG_datasets`` on the Hugging Face Hub):

- a split file, JSONL, one question per line: ``id`` (string), ``question`` (string),
  ``golden_answers`` (list of strings) and an optional ``metadata`` object (kept whole in
  ``meta["metadata"]``; other fields of the line are kept in ``meta`` too);
- a corpus file, JSONL, one document per line: ``id`` and ``contents``, where ``contents`` is
  the title on the first line and the text after it (``docs/building-index.md``: contents is
  ``"{title}"\\n{text}``, the title in double quotes). FlashRAG's prompts split it the same way
  (title = first line, text = the rest). So the document's title is the first line without
  its one pair of surrounding quotes, its text the rest; a ``contents`` without a line break
  is all text, no title. A corpus line with ``title`` and ``text`` instead of ``contents``
  (the other shape ``building-index.md`` accepts) is read as those. Other fields of a corpus
  line go to the document's ``meta``.

Every question is asked over the whole corpus, through the shared-corpus machinery
(``datasets.questions.to_examples``, as the ``corpus`` dataset does): one ``documents`` tuple
held by every example, ``meta["corpus_fingerprint"]`` naming it, so long context puts the same
corpus first for every question (one prefix cache serves them all) and RAG indexes that same
corpus once. A question with an empty ``golden_answers`` list is kept, unscored.

Refused with file, line and field: a missing or mistyped field, an empty question or document
text, a duplicate id (question or document), and an empty split or corpus file.
"""

from __future__ import annotations

import os

from ragbench.datasets._validate import STRINGS, FieldError, nonempty, opt, read_jsonl, req
from ragbench.datasets.corpus.file import corpus_fingerprint
from ragbench.datasets.questions import RESERVED_META, Question, to_examples
from ragbench.types import Document, Example

PathLike = str | os.PathLike
_QUESTION_FIELDS = ("id", "question", "golden_answers", "metadata")


def load_flashrag(path: PathLike, corpus: PathLike) -> list[Example]:
    """The questions of FlashRAG split file ``path``, each over all of ``corpus`` (see the module
    docstring)."""
    documents = tuple(read_flashrag_corpus(corpus))
    questions = read_flashrag_questions(path)
    fingerprint = corpus_fingerprint(documents)
    return to_examples(questions, documents, path, task_type="qa", corpus_fingerprint=fingerprint)


def build(path: PathLike, corpus: PathLike) -> list[Example]:
    """FlashRAG's format: a split JSONL (id, question, golden_answers) over a corpus JSONL.

    Every question is asked over the whole corpus (a shared corpus, stored once)."""
    return load_flashrag(path, corpus)


def read_flashrag_corpus(path: PathLike) -> list[Document]:
    """The documents of a FlashRAG corpus JSONL, in file order; an empty file is an error."""
    documents = read_jsonl(path, _document, id_field="id")
    return nonempty(path, documents, "no documents (an empty FlashRAG corpus file)")


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a FlashRAG ``contents``: the first line without its surrounding quotes,
    and the rest; no line break: no title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, rest


def _document(row: dict) -> Document:
    doc_id = req(row, "id", str)
    if "contents" in row:
        title, text = split_contents(req(row, "contents", str))
        where = ("contents",)
        extra = {k: v for k, v in row.items() if k not in ("id", "contents")}
    elif "text" in row:
        title, text = opt(row, "title", str, ""), req(row, "text", str)
        where = ("text",)
        extra = {k: v for k, v in row.items() if k not in ("id", "title", "text")}
    else:
        raise FieldError(("contents",), "missing required field (or 'title' and 'text')")
    if not text.strip():
        raise FieldError(where, "empty document text")
    return Document(id=doc_id, text=text, title=title, meta=extra)


def read_flashrag_questions(path: PathLike) -> list[Question]:
    """The questions of a FlashRAG split file, with their lines; a duplicate id names both."""
    questions = read_jsonl(path, _question, id_field="id", with_line=True)
    return nonempty(path, questions, "no questions (an empty FlashRAG split file)")


def _question(row: dict, lineno: int) -> Question:
    qid = req(row, "id", str).strip()
    if not qid:
        raise FieldError(("id",), "empty id")
    question = req(row, "question", str).strip()
    if not question:
        raise FieldError(("question",), "empty question")
    answers = tuple(a.strip() for a in req(row, "golden_answers", STRINGS) if a.strip())
    meta: dict[str, object] = {"source": "flashrag", "metadata": opt(row, "metadata", dict, {})}
    for key, value in row.items():
        if key in _QUESTION_FIELDS:
            continue
        if key in RESERVED_META or key in meta:
            raise FieldError((key,), "reserved: the dataset sets this meta key itself")
        meta[key] = value
    return Question(question=question, line=lineno, id=qid, answers=answers, meta=meta)
