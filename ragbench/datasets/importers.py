"""Importers for third-party dataset files: LongBench and RULER JSONL, SQuAD JSON.

``formats.IMPORTERS`` names them (``longbench``, ``ruler``, ``squad``) (import them from
here). Each returns ``list[Example]`` and raises one ``ragbench.io.InputFileError`` naming the file,
line and field for malformed input, and for input with no examples. (The importers of LongBench
v2, FlashRAG's format and local Hugging Face datasets, ``longbench_v2.py``, ``flashrag.py`` and
``hf_local.py``, are datasets of their own in ``ragbench.datasets.DATASETS``: ``longbench-v2``,
``flashrag``, ``hf``.) Choices, per format:

- ``longbench``: ``context`` becomes one document (id ``"{_id}/context"``), ``input`` the
  question. ``dataset``, ``length``, ``all_classes`` and any extra fields go to ``meta``, and
  ``meta["metric"]`` names the subset's official LongBench metric (``longbench_metrics``; the
  ``longbench`` metric scores with it). A subset LongBench does not have, a classification subset
  without ``all_classes`` or a retrieval answer without its paragraph number is an error: each
  would be scored wrongly. No evidence spans: LongBench answers are often free-form, so a string
  match would mislead.
- ``ruler``: RULER's ``input`` is one string (instructions, context, question). With RULER's
  plain templates the question follows the context on its own line, so the last non-empty line
  is the question and everything before it is kept as one document (id ``"{index}/input"``).
  An input rendered with a chat template or ending in an answer label (the last line is
  ``Answer:``, ``[/INST]``, ``<|...|>``) does not fit that rule and is an error naming the line,
  rather than an import whose every question is ``Answer:``. Evidence spans are the verbatim
  occurrences of each expected output in that document.
- ``squad``: v1.1 and v2.0 JSON. One example per question; its paragraph is the only document
  (id ``"{article}-{paragraph}"``, title = article title). ``answer_start`` offsets become
  ``meta["evidence"]`` spans and must match the answer text. v2 unanswerable questions are kept
  (``unanswerable="keep"``) with the no-answer gold ``answers=("unanswerable",)``
  (``metrics.NO_ANSWER``, the word the prompts' decline instruction asks for: declining scores
  1, answering 0) and ``meta["unanswerable"] = True``; every question of such a file gets
  ``meta["allow_decline"] = True``, so the prompt offers the decline option to answerable and
  unanswerable questions alike (offering it only to the unanswerable ones would leak the gold).
  ``unanswerable="drop"`` leaves them out instead. Every question of a v2.0 file (its
  ``version``, or any ``is_impossible`` question) gets ``meta["squad_v2"] = True``: it is
  scored as the official v2.0 script does (``metrics.squad``), and whether it has an answer is
  ``meta["unanswerable"]``, never its gold text. Line numbers in errors point into the JSON
  text (real SQuAD files are one line; the field path, e.g.
  ``data[0].paragraphs[2].qas[1].answers[0].answer_start``, locates the fault exactly).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ragbench.datasets._validate import (
    STRINGS,
    FieldError,
    check,
    nonempty,
    opt,
    parse_json_file,
    read_jsonl,
    req,
)
from ragbench.metrics.longbench import RETRIEVAL_PATTERNS, SUBSET_METRIC, subset_name
from ragbench.metrics.normalize import NO_ANSWER
from ragbench.registry import unknown
from ragbench.types import Document, Example

PathLike = str | os.PathLike


# --------------------------------------------------------------------------- LongBench

_LONGBENCH_FIELDS = {"input": str, "context": str, "answers": STRINGS, "length": int}
_LONGBENCH_FIELDS |= {"dataset": str, "_id": str}


def load_longbench(path: PathLike) -> list[Example]:
    """LongBench JSONL: each context one document, scored by its subset's official metric (see
    the module docstring)."""
    examples = read_jsonl(path, _longbench_example, id_field="_id")
    return nonempty(path, examples, "no examples (an empty LongBench file)")


def _longbench_metric(v: dict, all_classes: list[str] | None) -> str:
    """The subset's official metric; inputs it cannot score are errors here, not 0s later."""
    subset = subset_name(v["dataset"])
    if subset not in SUBSET_METRIC:
        raise FieldError(("dataset",), str(unknown("LongBench subset", subset, SUBSET_METRIC)))
    metric = SUBSET_METRIC[subset]
    if metric == "classification_score" and not all_classes:
        raise FieldError(("all_classes",), f"{subset} is scored over its classes: list them")
    if metric in RETRIEVAL_PATTERNS:
        for i, answer in enumerate(v["answers"]):
            if not re.search(RETRIEVAL_PATTERNS[metric], answer):
                pattern = RETRIEVAL_PATTERNS[metric].replace(r"(\d+)", "N")
                raise FieldError(("answers", i), f"expected {pattern!r}, got {answer!r}")
    return metric


def _longbench_example(row: dict) -> Example:
    v = {key: req(row, key, kind) for key, kind in _LONGBENCH_FIELDS.items()}
    all_classes = opt(row, "all_classes", STRINGS, None)
    metric = _longbench_metric(v, all_classes)
    meta = {k: val for k, val in row.items() if k not in _LONGBENCH_FIELDS}
    meta |= {"source": "longbench", "dataset": v["dataset"], "length": v["length"]}
    meta |= {"all_classes": all_classes, "metric": metric}
    doc = Document(id=f"{v['_id']}/context", text=v["context"])
    return Example(v["_id"], v["input"], tuple(v["answers"]), (doc,), meta)


# --------------------------------------------------------------------------- RULER

_RULER_FIELDS = {"index": int, "input": str, "outputs": STRINGS, "length": int}


def load_ruler(path: PathLike) -> list[Example]:
    """RULER's generated JSONL: the input's last line the question, the rest one document (see
    the module docstring)."""
    examples = read_jsonl(path, _ruler_example, id_field="index")
    return nonempty(path, examples, "no examples (an empty RULER file)")


# a last line that is a label or chat-template markup, not a question: "Answer:", "A:",
# "### Response:", "[/INST]", "<|im_start|>assistant", "<start_of_turn>model"
_NOT_A_QUESTION = re.compile(
    r"^[\W_]*[A-Za-z][A-Za-z ]{0,30}:\s*$"  # a bare label
    r"|<\|[^|>]*\|>|\[/?INST\]|</?s>|<<SYS>>|<(start|end)_of_turn>"  # chat-template markup
)


def split_ruler_input(text: str) -> tuple[str, str]:
    """(context, question): the question is the last non-empty line, the context all before it.
    A last line that is an answer label or chat-template markup is refused (see the module
    docstring): taking it as the question would ask every example "Answer:"."""
    context, sep, question = text.rstrip().rpartition("\n")
    if not sep or not context.strip() or not question.strip():
        raise ValueError("expected the context followed by the question on its own last line")
    if _NOT_A_QUESTION.search(question):
        raise ValueError(
            f"the last line {question.strip()[:60]!r} is not a question: this input ends with an "
            "answer label or a chat template; export RULER with its plain (base) template, whose "
            "input ends with the question on its own line"
        )
    return context, question.strip()


def _find_all(text: str, needle: str) -> list[tuple[int, int]]:
    spans, start = [], text.find(needle)
    while needle and start >= 0:
        spans.append((start, start + len(needle)))
        start = text.find(needle, start + len(needle))
    return spans


def _ruler_example(row: dict) -> Example:
    v = {key: req(row, key, kind) for key, kind in _RULER_FIELDS.items()}
    try:
        context, question = split_ruler_input(v["input"])
    except ValueError as exc:
        raise FieldError(("input",), str(exc)) from None
    doc = Document(id=f"{v['index']}/input", text=context)
    evidence = sorted({span for out in v["outputs"] for span in _find_all(context, out)})
    meta = {k: val for k, val in row.items() if k not in _RULER_FIELDS}
    meta |= {"source": "ruler", "index": v["index"], "length": v["length"]}
    meta["evidence"] = [[doc.id, s, e] for s, e in evidence]
    return Example(str(v["index"]), question, tuple(v["outputs"]), (doc,), meta)


# --------------------------------------------------------------------------- SQuAD


UNANSWERABLE = ("keep", "drop")  # what load_squad does with SQuAD 2.0's unanswerable questions


def load_squad(path: PathLike, unanswerable: str = "keep") -> list[Example]:
    """SQuAD v1.1 / v2.0 JSON (see the module docstring). ``unanswerable``: ``keep`` (no-answer
    gold: declining is correct) or ``drop``."""
    if unanswerable not in UNANSWERABLE:
        raise unknown("unanswerable policy", unanswerable, UNANSWERABLE)
    path = Path(path)
    examples = parse_json_file(path, _squad_examples)
    nonempty(path, examples, "no questions (data[].paragraphs[].qas[] are all empty)")
    if any(e.meta["unanswerable"] or e.meta["version"].startswith("v2") for e in examples):
        # scored as the official v2.0 script scores (metrics.squad), dropped questions or not
        examples = [replace(e, meta={**e.meta, "squad_v2": True}) for e in examples]
    if unanswerable == "drop":
        kept = [e for e in examples if not e.meta["unanswerable"]]
        return nonempty(path, kept, f"all {len(examples)} questions are unanswerable (dropped)")
    if any(e.meta["unanswerable"] for e in examples):
        examples = [replace(e, meta={**e.meta, "allow_decline": True}) for e in examples]
    return examples


def _squad_examples(data: Any) -> list[Example]:
    check(data, dict, ())
    version = opt(data, "version", str, "")
    examples: list[Example] = []
    seen: set[str] = set()
    for a, article in enumerate(req(data, "data", list)):
        where = ("data", a)
        check(article, dict, where)
        title = opt(article, "title", str, "", where)
        for p, para in enumerate(req(article, "paragraphs", list, where)):
            pwhere = where + ("paragraphs", p)
            check(para, dict, pwhere)
            doc = Document(id=f"{a}-{p}", text=req(para, "context", str, pwhere), title=title)
            for q, qa in enumerate(req(para, "qas", list, pwhere)):
                example = _squad_example(qa, pwhere + ("qas", q), doc, version)
                if example.id in seen:
                    raise FieldError(
                        pwhere + ("qas", q, "id"), f"duplicate question id {example.id!r}"
                    )
                seen.add(example.id)
                examples.append(example)
    return examples


def _squad_answers(qa: dict, key: str, where: tuple, doc: Document) -> list[tuple[str, int]]:
    out = []
    for i, ans in enumerate(req(qa, key, list, where)):
        awhere = where + (key, i)
        check(ans, dict, awhere)
        text, start = req(ans, "text", str, awhere), req(ans, "answer_start", int, awhere)
        found = doc.text[start : start + len(text)] if start >= 0 else ""
        if found != text:
            msg = f"{start} does not point at the answer text {text!r} (the context has {found!r})"
            raise FieldError(awhere + ("answer_start",), msg)
        out.append((text, start))
    return out


def _squad_example(qa: Any, where: tuple, doc: Document, version: str) -> Example:
    check(qa, dict, where)
    qid, question = req(qa, "id", str, where), req(qa, "question", str, where)
    unanswerable = opt(qa, "is_impossible", bool, False, where)
    answers = _squad_answers(qa, "answers", where, doc)
    if unanswerable and answers:
        raise FieldError(where + ("answers",), "must be empty when is_impossible is true")
    if not unanswerable and not answers:
        raise FieldError(
            where + ("answers",), "empty for an answerable question (v2: set is_impossible)"
        )
    # the no-answer gold (see the module docstring); answerable questions keep their texts
    texts = list(dict.fromkeys(t for t, _ in answers)) if answers else [NO_ANSWER]
    spans = list(dict.fromkeys((s, s + len(t)) for t, s in answers))
    meta: dict[str, Any] = {"source": "squad", "version": version, "title": doc.title}
    meta |= {"unanswerable": unanswerable, "evidence": [[doc.id, s, e] for s, e in spans]}
    if unanswerable and qa.get("plausible_answers"):
        plausible = _squad_answers(qa, "plausible_answers", where, doc)
        meta["plausible_answers"] = list(dict.fromkeys(t for t, _ in plausible))
    return Example(qid, question, tuple(texts), (doc,), meta)
