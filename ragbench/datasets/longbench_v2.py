"""LongBench v2 import: 503 four-choice questions over long contexts, with the official prompts.

The data (THUDM/LongBench-v2 on the Hugging Face Hub, ``data.json``; THUDM/LongBench's
``pred.py`` reads the same fields) is a JSON list, or JSONL, of objects with ``_id``, ``domain``,
``sub_domain``, ``difficulty`` (easy / hard), ``length`` (short / medium / long: the context's
bucket), ``question``, ``choice_A`` .. ``choice_D``, ``answer`` (the gold letter) and
``context``. Each becomes one Example:

- the ``context`` (stripped, as ``pred.py`` puts it in the prompt) is the only document
  (id ``"{_id}/context"``), so long context reads it whole and RAG retrieves from it;
- the question is the official 0-shot template's text after the document: the question, the
  four choices and the answer format ("The correct answer is (insert answer here)"), so every
  strategy asks for the letter the official extraction reads; the answer is the letter;
- ``meta`` keeps ``domain``, ``sub_domain``, ``difficulty``, ``length`` (which the breakdown
  table groups by: ``ragbench.analysis.longbench_v2``), ``choices`` and the plain question, and
  names the metric (``longbench_v2_accuracy``, ``metrics.longbench_v2``).

Refused with file, line and field: a missing or mistyped field, a difficulty, length bucket or
answer letter outside the official values, an empty choice, and a question that is already a
rendered prompt (it holds the template's own "What is the correct answer to this question:" or
"Choices:" lines): importing one would put the template in the prompt twice.

The official prompts are here as pure functions. ``TEMPLATES`` holds the five texts of the
repository's ``prompts/`` folder verbatim (0-shot, chain-of-thought, the chain-of-thought
answer step, no context, RAG); ``render`` fills one for an example as ``pred.py`` does (the
chain-of-thought protocol is two calls: ``0shot_cot``, then ``0shot_cot_ans`` with the first
reply as ``$COT$``). A template (a name, or a text of one's own) whose ``$...$`` placeholders
are not the official ones, or that needs ``$COT$`` without it being given, is an error.
``truncate_middle`` is ``pred.py``'s cut: a prompt over ``max_len`` tokens keeps its first
``max_len // 2`` and last ``-max_len // 2`` token ids (Python's floor division: an odd
``max_len`` gives the tail the extra token), decoded again.

How a ragbench run uses them. Each example names ``PROMPT_FORMAT`` in ``meta["prompt_format"]``,
so the strategies prompt with these templates (``strategies.prompt_format``): long context with
``0shot`` (``0shot_cot`` under ``cot: true``), RAG with ``0shot_rag`` over "Retrieved chunk N:"
blocks, closed book with ``0shot_no_context``; with ``cot: true`` the reply is sent back in
``0shot_cot_ans`` (``answer_step``) as ``pred.py`` does. ``frame`` splits a template around
``$DOC$`` so the strategies can fit the context to the window and reuse the document's KV. The
whole reply is scored by the official extraction. Where a run departs from ``pred.py``: decoding
is greedy (``pred.py``: temperature 0.1); ``overflow: truncate_middle`` cuts the context (by the
run's tokenizer) rather than the whole prompt, so the instruction and the question are kept
whole; an empty reply is scored wrong and an empty reasoning still gets its answer step
(``pred.py`` drops the item).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ragbench.datasets._validate import (
    FieldError,
    check,
    nonempty,
    parse_json_file,
    read_jsonl,
    req,
)
from ragbench.io import require_file
from ragbench.metrics.longbench_v2 import CHOICES, DIFFICULTIES, LENGTHS, METRIC
from ragbench.registry import unknown
from ragbench.tokenizers import Tokenizer, get_tokenizer
from ragbench.types import Document, Example

PathLike = str | os.PathLike

# THUDM/LongBench prompts/*.txt (LongBench v2), verbatim: 0shot.txt, 0shot_cot.txt,
# 0shot_cot_ans.txt, 0shot_no_context.txt, 0shot_rag.txt
_CHOICES_BLOCK = (
    "What is the correct answer to this question: $Q$\nChoices:\n"
    "(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
)
_FORMAT = 'Format your response as follows: "The correct answer is (insert answer here)".'
TEMPLATES = {
    "0shot": "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n"
    "</text>\n\n" + _CHOICES_BLOCK + _FORMAT,
    "0shot_cot": "Please read the following text and answer the questions below.\n\n<text>\n"
    "$DOC$\n</text>\n\n" + _CHOICES_BLOCK + "Let\u2019s think step by step:",
    "0shot_cot_ans": "Please read the following text and answer the questions below.\n\n"
    "The text is too long and omitted here.\n\n"
    + _CHOICES_BLOCK
    + "Let\u2019s think step by step: $COT$\n\nBased on the above, what is the single, most "
    "likely answer choice? " + _FORMAT,
    "0shot_no_context": _CHOICES_BLOCK
    + "What is the single, most likely answer choice? "
    + _FORMAT,
    "0shot_rag": "Please read the following retrieved text chunks and answer the question below."
    "\n\n<text>\n$DOC$\n</text>\n\n" + _CHOICES_BLOCK + _FORMAT,
}
FORMAT_LINE = _FORMAT  # the answer format the extraction reads (last line of the templates)
PROMPT_FORMAT = "longbench_v2"  # meta["prompt_format"]: the strategies prompt with TEMPLATES
COT_TOKENS = 1024  # pred.py's max_new_tokens for the chain-of-thought call (the answer: 128)
PLACEHOLDERS = ("$DOC$", "$Q$", "$C_A$", "$C_B$", "$C_C$", "$C_D$", "$COT$")
_PLACEHOLDER = re.compile(r"\$[A-Z_]+\$")
# the lines of a rendered prompt: a question holding one was exported already templated
_RENDERED = ("What is the correct answer to this question:", "\nChoices:\n(A) ")

_FIELDS = {key: str for key in ("_id", "domain", "sub_domain", "question", "context")}
_CHOICE_FIELDS = tuple(f"choice_{c}" for c in CHOICES)
_ONE_OF = {"difficulty": DIFFICULTIES, "length": LENGTHS, "answer": CHOICES}


# --------------------------------------------------------------------------- import


def load_longbench_v2(path: PathLike) -> list[Example]:
    """The examples of a LongBench v2 file: a JSON list (``data.json``) or JSONL (see the module
    docstring); an empty file is an error."""
    path = Path(path)
    require_file(path)
    if path.suffix.lower() == ".json":
        examples = _from_json_list(path)
    else:
        examples = read_jsonl(path, _example, id_field="_id")
    return nonempty(path, examples, "no examples (an empty LongBench v2 file)")


def build(path: PathLike) -> list[Example]:
    """LongBench v2 (THUDM): four-choice questions over long contexts, official prompts and scoring.

    Scored by ``pred.py``'s answer extraction (metric ``longbench_v2_accuracy``)."""
    return load_longbench_v2(path)


def _from_json_list(path: Path) -> list[Example]:
    return parse_json_file(path, _examples)


def _examples(data: Any) -> list[Example]:
    check(data, list, ())
    examples: list[Example] = []
    first: dict[str, int] = {}
    for i, row in enumerate(data):
        check(row, dict, (i,))
        try:
            example = _example(row)
        except FieldError as bad:
            raise FieldError((i, *bad.where), bad.message) from None
        if example.id in first:
            msg = f"duplicate _id {example.id!r} (first at [{first[example.id]}])"
            raise FieldError((i, "_id"), msg)
        first[example.id] = i
        examples.append(example)
    return examples


# the fields of ragbench's own JSONL (``Example.to_json``): what ``ragbench data import`` writes
_IMPORTED = {"id", "question", "answers", "documents"}


def _example(row: dict) -> Example:
    if "_id" not in row and set(row) >= _IMPORTED:  # an import of this file, not the file
        raise FieldError(
            (),
            (
                "this is a file `ragbench data import` wrote (ragbench's JSONL), not LongBench v2's "
                "data.json: run it as `dataset: {name: file, params: {path: <this file>}}`"
            ),
        )
    v: dict[str, Any] = {key: req(row, key, kind) for key, kind in _FIELDS.items()}
    for key, valid in _ONE_OF.items():
        value = req(row, key, str)
        if value not in valid:
            raise FieldError((key,), str(unknown(key, value, valid)))
        v[key] = value
    choices = {}
    for letter, key in zip(CHOICES, _CHOICE_FIELDS, strict=True):
        choices[letter] = req(row, key, str).strip()
        if not choices[letter]:
            raise FieldError((key,), "empty choice")
    question = v["question"].strip()
    if not question:
        raise FieldError(("question",), "empty question")
    for line in _RENDERED:
        if line in question:
            raise FieldError(
                ("question",),
                f"already a rendered prompt (it holds the template's {line.strip()!r}): "
                "import the plain question, as in LongBench v2's data.json",
            )
    context = v["context"].strip()
    if not context:
        raise FieldError(("context",), "empty context")
    known = {*_FIELDS, *_ONE_OF, *_CHOICE_FIELDS}
    meta = {k: val for k, val in row.items() if k not in known}
    meta |= {"source": "longbench_v2", "task": "longbench_v2", "task_type": "qa"}
    meta |= {k: v[k] for k in ("domain", "sub_domain", "difficulty", "length")}
    meta |= {"question_text": question, "choices": choices, "metric": METRIC}
    meta["prompt_format"] = PROMPT_FORMAT
    doc = Document(id=f"{v['_id']}/context", text=context)
    return Example(v["_id"], question_block(question, choices), (v["answer"],), (doc,), meta)


# --------------------------------------------------------------------------- official prompts


def question_block(question: str, choices: dict[str, str]) -> str:
    """The 0-shot template's text after the document: question, choices, answer format."""
    block = _CHOICES_BLOCK + _FORMAT
    return _fill(block, {"$Q$": question.strip(), **_choice_values(choices)})


def _choice_values(choices: dict[str, str]) -> dict[str, str]:
    return {f"$C_{c}$": choices[c].strip() for c in CHOICES}


def template_text(template: str) -> str:
    """The text of ``template``: a name in ``TEMPLATES``, or a template text of one's own
    (anything holding ``$Q$``), checked to use the official placeholders only."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if "$Q$" not in template:
        raise unknown("LongBench v2 template", template, TEMPLATES)
    found = set(_PLACEHOLDER.findall(template))
    extra = sorted(found - set(PLACEHOLDERS))
    if extra:
        raise ValueError(
            f"template placeholder {extra[0]} does not match LongBench v2's; valid: "
            f"{', '.join(PLACEHOLDERS)}"
        )
    missing = [p for p in PLACEHOLDERS[1:6] if p not in found]
    if missing:
        raise ValueError(f"template lacks {', '.join(missing)}: every choice must be shown")
    return template


def render(template: str, example: Example, context: str | None = None, cot: str = "") -> str:
    """The official prompt for ``example`` (imported by ``load_longbench_v2``), filled as
    ``pred.py`` fills it: ``$DOC$`` is ``context`` (default: the example's context), stripped;
    ``$COT$`` is the first call's reply in the chain-of-thought answer step."""
    text = template_text(template)
    _meta(example)
    if "$COT$" in text and not cot.strip():
        raise ValueError("this template is the chain-of-thought answer step: pass cot=")
    if cot and "$COT$" not in text:
        raise ValueError("cot= was given but the template has no $COT$ placeholder")
    doc = (example.context if context is None else context).strip()
    values = {"$DOC$": doc, "$Q$": example.meta["question_text"].strip()}
    values |= _choice_values(example.meta["choices"]) | {"$COT$": cot}
    return _fill(text, values)


def frame(template: str, example: Example) -> tuple[str, str, str]:
    """``template`` (one holding ``$DOC$``) for ``example`` as (head, separator, question part):
    the prompt is ``head + context + separator + question part``, as ``render`` fills it;
    the first two and the context do not depend on the question (a shared KV prefix)."""
    text = template_text(template)
    head, found, after = text.partition("$DOC$")
    if not found:
        raise ValueError(f"LongBench v2 template {template!r} has no $DOC$ to put the context in")
    separator, start, rest = after.partition(_RENDERED[0])  # the question block's first words
    meta = _meta(example)
    values = {"$Q$": meta["question_text"].strip(), **_choice_values(meta["choices"])}
    return head, separator, _fill(start + rest, values)


def answer_step(example: Example, reasoning: str) -> str:
    """The chain-of-thought answer step (``0shot_cot_ans``) with ``reasoning`` (the first call's
    reply, stripped as ``pred.py`` does) as ``$COT$``; an empty reasoning is kept empty."""
    meta = _meta(example)
    values = {"$Q$": meta["question_text"].strip(), "$COT$": reasoning.strip()}
    return _fill(TEMPLATES["0shot_cot_ans"], values | _choice_values(meta["choices"]))


def _meta(example: Example) -> dict[str, Any]:
    if "choices" not in example.meta or "question_text" not in example.meta:
        raise ValueError(
            f"example {example.id!r} is not a LongBench v2 example (no choices in its meta)"
        )
    return example.meta


def _fill(text: str, values: dict[str, str]) -> str:
    """``pred.py``'s chain of ``str.replace``, in its order ($DOC$, $Q$, $C_A$..$C_D$, $COT$)."""
    for key in PLACEHOLDERS:
        if key in values:
            text = text.replace(key, values[key])
    return text


def truncate_middle(prompt: str, max_len: int, tokenizer: str | Tokenizer) -> str:
    """``pred.py``'s truncation: over ``max_len`` tokens, keep the first ``max_len // 2`` and the
    last ``-max_len // 2`` token ids and decode them; otherwise ``prompt`` unchanged.
    ``tokenizer``: a ``ragbench.tokenizers`` name or a tokenizer (special tokens are not
    counted: the chat template adds them)."""
    if max_len < 2:
        raise ValueError(f"max_len must be at least 2 tokens, got {max_len}")
    tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    ids = tok.encode(prompt)
    if len(ids) <= max_len:
        return prompt
    return tok.decode(ids[: max_len // 2] + ids[-max_len // 2 :])
