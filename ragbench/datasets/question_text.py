"""The text side of generated questions: passages, the prompt, and parsing and checking a reply.

Pure functions, no model: ``question_gen`` drives them, one batch of passages at a time.

- Passages: ``Passage``, a piece of one document (``retrieval.passages.sample_passages`` chunks
  a corpus into them); ``passage_id`` names one in requests and rejections.
- The request for one passage (``generation_request``): ``GENERATE_TEMPLATE``, the two-line
  format shown by one worked example, its instructions named as the shared prompt prefix.
- The reply: ``parse_reply`` reads the (question, answer) pair, ``read_reply`` adds the checks
  of its form; ``check_reply`` applies the per-reply checks and builds the question row, with
  ``find_span`` (the answer in its passage, never inside a word) and ``evidence_quote`` (the
  sentence around it; ``sentence_spans``: every sentence of a text).
- Near duplicates: ``tokens`` (normalised word set) and their exact ``jaccard``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragbench.datasets.corpus.cleaning import normalize_for_hash
from ragbench.metrics.normalize import normalize_answer
from ragbench.types import GenerationRequest

# One worked example before the passage: small models (SmolLM2-135M) ignore a format that is
# only described, and copy one that is shown.
GENERATE_TEMPLATE = (
    "Write one question about the text and its answer, a short phrase copied word for word "
    "from the text. Reply in exactly this format:\n"
    "Question: <the question>\n"
    "Answer: <the answer>\n\n"
    "Text: The museum opens at 9:00 and closes at 17:00 on weekdays.\n"
    "Question: When does the museum open on weekdays?\n"
    "Answer: 9:00\n\n"
    "Text: {passage}\n"
)
_LABEL = re.compile(
    r"^[\s>#*_\-•]*(?:\d+[.)]\s*)?[*_]*(?P<label>question|answer|q|a)[*_]*\s*[:：][*_]*\s*",
    re.IGNORECASE,
)
_ANSWER_INLINE = re.compile(r"\s[*_]*answer[*_]*\s*[:：]", re.IGNORECASE)
_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")


# --------------------------------------------------------------------------- passages


@dataclass(frozen=True)
class Passage:
    """A piece of one document: ``text == document.text[start:end]``."""

    doc_id: str
    start: int
    end: int
    text: str


def passage_id(passage: Passage) -> str:
    return f"{passage.doc_id}@{passage.start}-{passage.end}"


# --------------------------------------------------------------------------- request, reply


def generation_request(passage: Passage, max_new_tokens: int = 64) -> GenerationRequest:
    # no stop sequence: a model that puts a blank line between the two lines must not lose its
    # answer; 64 tokens hold a question and a short answer
    prompt = GENERATE_TEMPLATE.format(passage=passage.text)
    # the instructions and the worked example are the same for every passage: named as the
    # prefix, a backend or server computes their KV once
    prefix = GENERATE_TEMPLATE[: GENERATE_TEMPLATE.index("{passage}")]
    return GenerationRequest(
        prompt=prompt, max_new_tokens=max_new_tokens, prefix=prefix, id=passage_id(passage)
    )


def _strip(text: str) -> str:
    return text.strip().strip("*_").strip().strip("\"'“”‘’`").strip()


def parse_reply(text: str) -> tuple[str, str] | None:
    """(question, answer) from a reply in the two-line format, or None.

    Accepts labels in any case (``Q:``/``A:`` too), markdown emphasis (``**Question:**``),
    list markers or numbering before them, blank lines between them, and both on one line; takes
    the first pair. The answer loses surrounding quotes and a final period. An unfilled template
    (``<the question>``) is no pair.
    """
    question = answer = None
    for raw in text.splitlines():
        line = raw
        inline = _ANSWER_INLINE.search(line)
        if question is None and inline and _LABEL.match(line):
            # "Question: ...? Answer: ..." on one line: read it as two
            line, rest = line[: inline.start()], line[inline.start() :].strip()
            m = _LABEL.match(line)
            if m and m["label"].lower() in ("question", "q"):
                question = _strip(line[m.end() :])
                line = rest
        m = _LABEL.match(line)
        if not m:
            continue
        value = _strip(line[m.end() :])
        if m["label"].lower() in ("question", "q") and question is None:
            question = value
        elif m["label"].lower() in ("answer", "a") and question is not None:
            answer = value
            break
    if not question or not answer:
        return None
    answer = _strip(answer.rstrip(".").rstrip())
    both = question + answer
    if not answer or ("<" in both and ">" in both):
        return None
    return question, answer


def find_span(answer: str, text: str) -> tuple[int, int] | None:
    """Where ``answer`` occurs in ``text``: verbatim (runs of whitespace may differ), else
    ignoring case; never starting or ending inside a word ("31" is not in "1931")."""
    words = answer.split()
    if not words:
        return None
    body = r"\s+".join(re.escape(w) for w in words)
    head = r"(?<!\w)" if re.match(r"\w", answer) else ""
    tail = r"(?!\w)" if re.search(r"\w$", answer) else ""
    for flags in (0, re.IGNORECASE):
        m = re.search(head + body + tail, text, flags)
        if m:
            return m.start(), m.end()
    return None


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentence spans of ``text`` (bounded by . ! ? and line ends, as in ``evidence_quote``),
    stripped of surrounding whitespace; empty ones left out."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.end() if m.group() != "\n" else m.start()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


def evidence_quote(text: str, start: int, end: int, max_chars: int = 300) -> tuple[int, int]:
    """The sentence of ``text`` around ``[start, end)`` (bounded by . ! ? and line ends), cut to
    ``max_chars`` around the answer: a quote specific enough to locate the evidence again."""
    left = max((m.end() for m in _SENTENCE_END.finditer(text, 0, start)), default=0)
    m = _SENTENCE_END.search(text, end)
    right = m.end() if m and m.group() != "\n" else (m.start() if m else len(text))
    left, right = max(left, start - max_chars // 2), min(right, end + max_chars // 2)
    while left < start and text[left].isspace():
        left += 1
    while right > end and text[right - 1].isspace():
        right -= 1
    return left, right


# --------------------------------------------------------------------------- checks


def read_reply(reply: str, max_answer_words: int) -> tuple[str, str] | str:
    """(question, answer) of ``reply``, or the reason its form is rejected: ``format``,
    ``not_a_question``, ``answer_too_long``."""
    parsed = parse_reply(reply)
    if parsed is None:
        return "format"
    question, answer = parsed
    if not question.endswith("?"):
        return "not_a_question"
    if len(answer.split()) > max_answer_words:
        return "answer_too_long"
    return question, answer


def check_reply(passage: Passage, reply: str, max_answer_words: int) -> dict[str, object] | str:
    """The question row for ``reply`` to ``passage``, or the reason it is rejected (``REASONS``
    in ``question_gen``: the per-reply ones, ``format`` to ``answer_in_question``)."""
    parsed = read_reply(reply, max_answer_words)
    if isinstance(parsed, str):
        return parsed
    question, answer = parsed
    span = find_span(answer, passage.text)
    if span is None:
        return "answer_not_in_passage"
    answer = passage.text[span[0] : span[1]]  # the document's own spelling, not the model's
    if f" {normalize_answer(answer)} " in f" {normalize_answer(question)} ":
        return "answer_in_question"
    q_start, q_end = evidence_quote(passage.text, *span)
    off = passage.start
    return {
        "question": question,
        "answers": [answer],
        "evidence": [passage.text[q_start:q_end]],
        "task_type": "qa",
        "meta": {
            "source": "generated",
            "answer_span": [passage.doc_id, off + span[0], off + span[1]],
            "passage": [passage.doc_id, passage.start, passage.end],
        },
    }


def tokens(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(normalize_for_hash(text)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0
