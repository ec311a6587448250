"""ragbench's own prompts, and truncation: how a question and its context become the text a model
reads, for examples without a prompt format of their own (``prompt_format``).

Long-context and RAG prompts share one layout: the context first (``CONTEXT_TEMPLATE``, so one
document's KV cache serves every question on it) and the question last. Answers are one line:
``clean_answer`` takes the first non-empty line without a label or a restated question.
"""

from __future__ import annotations

from collections.abc import Callable

from ragbench.datasets.task_types import INSTRUCTIONS
from ragbench.registry import Choice, Registry, unknown
from ragbench.types import Example

# what the long-context strategies do when the context does not fit (see ``truncate``)
OVERFLOW = Registry(
    "overflow policy",
    {
        "error": Choice("stop with an error naming the sizes (the default)"),
        "truncate_middle": Choice("keep the head and the tail (LongBench)"),
        "truncate_head": Choice("drop the start, keep the end"),
        "truncate_tail": Choice("drop the end, keep the start"),
    },
)
OVERFLOW_ERROR = "error"  # the policy that stops instead of cutting (a run checks it up front)
CONTEXT_TEMPLATE = "{context}\n\n"
QUESTION_TEMPLATE = (
    "Answer the question based on the text above. {instruction}\nQuestion: {question}\nAnswer:"
)
CLOSED_BOOK_TEMPLATE = "Answer the question. {instruction}\nQuestion: {question}\nAnswer:"
# Answers are one line (clean_answer keeps the first); small models restate and repeat after a
# blank line, so stopping there saves decode time without changing the scored answer.
ANSWER_STOP = ("\n\n",)
DECLINE = "unanswerable"
DECLINE_INSTRUCTION = f' If the text above does not contain the answer, reply exactly "{DECLINE}".'


def task_type(example: Example) -> str:
    """``needle`` for NIAH/RULER retrieval tasks (exact value), ``qa`` otherwise."""
    explicit = example.meta.get("task_type")
    if explicit in INSTRUCTIONS:
        return explicit
    task = str(example.meta.get("task", "")).lower()
    return "needle" if ("niah" in task or "needle" in task or "magic" in example.question) else "qa"


def question_part(example: Example, decline: bool = False) -> str:
    # datasets whose questions may have no answer in the text (SQuAD 2.0) set allow_decline on
    # every question: declining is then a correct answer, so the prompt must offer it
    decline = decline or example.meta.get("allow_decline") is True
    instruction = INSTRUCTIONS[task_type(example)] + (DECLINE_INSTRUCTION if decline else "")
    return QUESTION_TEMPLATE.format(instruction=instruction, question=example.question)


def clean_answer(text: str, question: str = "") -> str:
    """First non-empty line, without an "Answer:" / "A:" label (any case) or a restated question.
    A line that is only a label gives way to the next non-empty line ("Answer:", "Paris")."""
    t = ""
    for line in text.splitlines():
        t = line.strip()
        for label in ("answer:", "a:"):
            if t.lower().startswith(label):
                t = t[len(label) :].strip()
        if t:
            break
    q = question.strip()
    if q and t.lower().startswith(q.lower()):
        t = t[len(q) :].strip()
    return t.strip(" \"'")


def is_declined(answer: str) -> bool:
    return DECLINE in answer.lower()


def _longest_fit(text: str, n_tokens: int, count: Callable[[str], int], head: bool) -> int:
    """Length in characters of the longest head (or tail) of ``text`` with at most ``n_tokens``
    tokens: binary search on characters, so it works with any backend's ``count_tokens`` (no
    encode/decode needed)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        piece = text[:mid] if head else text[len(text) - mid :]
        if count(piece) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def kept_ranges(
    text: str, n_tokens: int, policy: str, count: Callable[[str], int]
) -> list[tuple[int, int]]:
    """The half-open character ranges of ``text`` that ``truncate`` keeps, in order (none, one,
    or for ``truncate_middle`` the head's and the tail's): what says which documents and which
    evidence spans survived the cut."""
    if policy not in OVERFLOW or policy == OVERFLOW_ERROR:
        raise unknown("overflow policy", policy, [p for p in OVERFLOW if p != OVERFLOW_ERROR])
    if n_tokens <= 0:
        return []
    n = len(text)
    if policy == "truncate_head":  # keep the end
        return _ranges((n - _longest_fit(text, n_tokens, count, head=False), n))
    if policy == "truncate_tail":  # keep the start
        return _ranges((0, _longest_fit(text, n_tokens, count, head=True)))
    budget = n_tokens  # truncate_middle: keep the head and the tail
    while budget > 0:  # token counts are not additive across a join: shrink until it fits
        head = _longest_fit(text, budget // 2, count, head=True)
        tail = _longest_fit(text[head:], budget - budget // 2, count, head=False)
        joined = count(text[:head] + text[n - tail :])
        if joined <= n_tokens:
            return _ranges((0, head), (n - tail, n))
        budget -= max(1, joined - n_tokens)
    return []


def _ranges(*ranges: tuple[int, int]) -> list[tuple[int, int]]:
    """Non-empty ranges, adjacent ones merged (a head and a tail that meet keep everything)."""
    out: list[tuple[int, int]] = []
    for start, end in ranges:
        if end <= start:
            continue
        if out and out[-1][1] >= start:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def truncate(text: str, n_tokens: int, policy: str, count: Callable[[str], int]) -> str:
    """Cut ``text`` to at most ``n_tokens`` tokens under ``policy`` (see ``OVERFLOW``): the text
    of ``kept_ranges``, joined."""
    return "".join(text[s:e] for s, e in kept_ranges(text, n_tokens, policy, count))
