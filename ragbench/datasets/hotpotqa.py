"""HotpotQA's official JSON (``hotpot_dev_distractor_v1.json`` and its siblings) as examples.

The file is one JSON list; each question is an object with ``_id``, ``question``, ``answer``,
``context`` (``[title, [sentence, ...]]`` pairs: in the distractor setting the two gold
paragraphs and eight distractors) and ``supporting_facts`` (``[title, sentence index]`` pairs),
plus ``type`` and ``level``. One example per question: its context paragraphs are its documents
(id and title: the paragraph title; text: the sentences joined as HotpotQA and RULER join them,
with no separator, since each sentence carries its own leading space), and each supporting fact
is an evidence span over its sentence. A supporting fact naming a sentence the paragraph does not
have (the official dev file has a few) gives no span and is counted in
``meta["missing_supporting_facts"]``; the question keeps its other spans.

Malformed input raises one ``InputFileError`` naming the file, line and field (the JSON path,
e.g. ``[3].context[1][1][0]``); a file with no questions is one too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ragbench.datasets._validate import (
    FieldError,
    check,
    nonempty,
    opt,
    parse_json_file,
    req,
)
from ragbench.io import InputFileError
from ragbench.types import Document, Example


def load_hotpotqa(path: str | os.PathLike) -> list[Example]:
    """Every question of a HotpotQA JSON file (see the module docstring)."""
    path = Path(path)

    def questions(data: Any) -> list[Example]:
        if isinstance(data, dict) and "data" in data:  # the shape of SQuAD's files
            raise InputFileError(
                path,
                1,
                "a SQuAD file (an object with 'data'), not HotpotQA's list of questions: "
                "build ruler/qa_1 from it (RULER's qa_2 is HotpotQA)",
            )
        check(data, list, ())
        examples, seen = [], set()
        for i, row in enumerate(data):
            example = _question(row, (i,))
            if example.id in seen:
                raise FieldError((i, "_id"), f"duplicate question id {example.id!r}")
            seen.add(example.id)
            examples.append(example)
        return examples

    examples = parse_json_file(path, questions)
    return nonempty(path, examples, "no questions (an empty HotpotQA list)")


def _pair(value: Any, where: tuple) -> tuple[Any, Any]:
    check(value, list, where)
    if len(value) != 2:
        raise FieldError(where, f"expected a [title, ...] pair, got {len(value)} items")
    return value[0], value[1]


def _question(row: Any, where: tuple) -> Example:
    check(row, dict, where)
    qid, question = req(row, "_id", str, where), req(row, "question", str, where)
    answer = req(row, "answer", str, where)
    docs: list[Document] = []
    sentence_spans: dict[tuple[str, int], tuple[str, int, int]] = {}
    for p, para in enumerate(req(row, "context", list, where)):
        pwhere = where + ("context", p)
        title, sents = _pair(para, pwhere)
        check(title, str, pwhere + (0,))
        check(sents, list, pwhere + (1,))
        doc_id = title if all(d.id != title for d in docs) else f"{title}#{p}"
        pos = 0
        for s, sent in enumerate(sents):
            check(sent, str, pwhere + (1, s))
            sentence_spans.setdefault((title, s), (doc_id, pos, pos + len(sent)))
            pos += len(sent)
        docs.append(Document(id=doc_id, text="".join(sents), title=title))
    evidence, missing = [], 0
    facts = req(row, "supporting_facts", list, where)
    for f, fact in enumerate(facts):
        title, index = _pair(fact, where + ("supporting_facts", f))
        check(title, str, where + ("supporting_facts", f, 0))
        check(index, int, where + ("supporting_facts", f, 1))
        span = sentence_spans.get((title, index))
        if span is None:
            missing += 1
        elif list(span) not in evidence:
            evidence.append(list(span))
    meta: dict[str, Any] = {"source": "hotpotqa", "type": opt(row, "type", str, "", where)}
    meta |= {"level": opt(row, "level", str, "", where), "supporting_facts": facts}
    meta |= {"evidence": evidence, "missing_supporting_facts": missing, "task_type": "qa"}
    return Example(qid, question, (answer,), tuple(docs), meta)
