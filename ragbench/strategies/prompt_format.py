"""Prompt formats: how an example and its context become the prompt, and the reply the prediction.

An example names its format in ``meta["prompt_format"]`` (an importer of a benchmark with
official prompts sets it; a LongBench v2 file imported before formats existed is known by its
``meta["source"]``); an example without one uses ``ragbench``'s. Every strategy that asks
the run's model (closed book, long context, RAG, Self-Route, a pipeline's retriever) builds its
prompt through the example's format, so a benchmark is run with the prompts its own scripts use.

- ``ragbench``: the context first, then "Answer the question based on the text above", the
  task's instruction and the question (``prompts.question_part``); the answer is the reply's
  first line (``clean_answer``), decoding stops at a blank line. No chain of thought.
- ``longbench_v2``: LongBench v2's official templates (``datasets.longbench_v2``): long context
  ``0shot``, RAG ``0shot_rag`` with "Retrieved chunk N:" blocks, closed book
  ``0shot_no_context``; the whole reply is the prediction (the metric extracts the letter).
  Chain of thought (``cot: true`` on closed_book, long_context and rag) is ``pred.py``'s two
  calls: the first (long context: ``0shot_cot``) with up to ``COT_TOKENS`` new tokens and no
  stop string, then ``0shot_cot_ans`` with that reply as ``$COT$``, whose reply is scored.
  Self-Route's "unanswerable" option is one sentence before the answer-format line; a reply
  declines when it says "unanswerable" and names no letter. The rag strategy's ``cite`` has no
  effect: every chunk is marked "Retrieved chunk N:", as ``pred.py`` marks them.

A prompt around its context is a ``Frame`` (head + context + separator + question part): the
strategies fit the context to the window inside it, and the first three are the KV prefix that
every question on one document shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import ragbench.datasets.longbench_v2 as lb2
from ragbench.datasets.task_types import INSTRUCTIONS
from ragbench.metrics.longbench_v2 import extract_answer
from ragbench.registry import unknown
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.prompts import (
    ANSWER_STOP,
    CLOSED_BOOK_TEMPLATE,
    CONTEXT_TEMPLATE,
    DECLINE_INSTRUCTION,
    clean_answer,
    is_declined,
    question_part,
    task_type,
)
from ragbench.types import Example

FULL, RETRIEVED = "full", "retrieved"  # what a frame holds: the whole context or retrieved chunks
CITE_MARKER = "[{n}] "  # ragbench's chunk marker when the rag strategy's cite is true


@dataclass(frozen=True)
class Frame:
    """A prompt around its context: ``head + context + separator + tail`` (tail: the question
    part). ``prefix(context)`` does not depend on the question."""

    head: str
    separator: str
    tail: str

    def prefix(self, context: str) -> str:
        return self.head + context + self.separator

    def prompt(self, context: str) -> str:
        return self.prefix(context) + self.tail

    def context_of(self, prefix: str) -> str:
        """The context inside ``prefix(context)``."""
        return prefix.removeprefix(self.head).removesuffix(self.separator)

    def with_tail(self, tail: str) -> Frame:
        return replace(self, tail=tail)


class PromptFormat:
    """ragbench's own prompts (see the module docstring); subclasses are other formats."""

    name: ClassVar[str] = "ragbench"
    stop: ClassVar[tuple[str, ...]] = ANSWER_STOP  # the answer call's stop strings
    # how retrieved chunks are marked: None is the rag strategy's ``cite`` with CITE_MARKER; a
    # format string with ``{n}`` marks every chunk so (the format's own layout)
    chunk_marker: ClassVar[str | None] = None
    cot_tokens: ClassVar[int | None] = None  # the reasoning call's new tokens; None: no CoT

    def frame(
        self, example: Example, source: str, decline: bool = False, cot: bool = False
    ) -> Frame:
        """The frame for the whole context (``FULL``) or retrieved chunks (``RETRIEVED``);
        ``decline`` adds the "unanswerable" option (Self-Route), ``cot`` the reasoning call's."""
        self.require_cot(cot)
        head, _, separator = CONTEXT_TEMPLATE.partition("{context}")
        return Frame(head, separator, question_part(example, decline))

    def closed_book(self, example: Example, cot: bool = False) -> str:
        self.require_cot(cot)
        instruction = INSTRUCTIONS[task_type(example)]
        return CLOSED_BOOK_TEMPLATE.format(instruction=instruction, question=example.question)

    def cot_answer(self, example: Example, reasoning: str) -> str:
        """The second call of chain of thought: ``reasoning`` (the first reply) and the ask."""
        self.require_cot(True)
        raise NotImplementedError  # every format with cot_tokens overrides this

    def prediction(self, example: Example, reply: str) -> str:
        """What is scored: the reply's first line, cleaned (``clean_answer``)."""
        return clean_answer(reply, example.question)

    def declined(self, example: Example, reply: str) -> bool:
        """Whether ``reply`` takes Self-Route's "unanswerable" option."""
        return is_declined(self.prediction(example, reply))

    def require_cot(self, cot: bool = True) -> None:
        """Raise ValueError, naming the formats that have one, when ``cot`` is asked of a
        format without a chain-of-thought protocol."""
        if cot and self.cot_tokens is None:
            with_cot = [name for name, f in FORMATS.items() if f.cot_tokens is not None]
            raise ValueError(
                f"cot: the {self.name!r} prompt format has no chain-of-thought protocol; "
                f"formats with one: {', '.join(with_cot)} (an example's meta prompt_format, "
                "set by its importer)"
            )


class LongBenchV2Format(PromptFormat):
    """LongBench v2's official templates and two-call chain of thought (``pred.py``)."""

    name: ClassVar[str] = lb2.PROMPT_FORMAT
    stop: ClassVar[tuple[str, ...]] = ()  # pred.py stops at the model's end of turn only
    chunk_marker: ClassVar[str | None] = "Retrieved chunk {n}: "  # pred.py's retrieved blocks
    cot_tokens: ClassVar[int | None] = lb2.COT_TOKENS

    def frame(
        self, example: Example, source: str, decline: bool = False, cot: bool = False
    ) -> Frame:
        # pred.py: --rag takes 0shot_rag whether or not --cot is set
        template = "0shot_rag" if source == RETRIEVED else ("0shot_cot" if cot else "0shot")
        head, separator, tail = lb2.frame(template, example)
        if decline:  # Self-Route's option, just before the answer format
            tail = tail.replace(
                lb2.FORMAT_LINE, DECLINE_INSTRUCTION.strip() + "\n" + lb2.FORMAT_LINE
            )
        return Frame(head, separator, tail)

    def closed_book(self, example: Example, cot: bool = False) -> str:
        return lb2.render("0shot_no_context", example)

    def cot_answer(self, example: Example, reasoning: str) -> str:
        return lb2.answer_step(example, reasoning)

    def prediction(self, example: Example, reply: str) -> str:
        return reply.strip()  # pred.py's response; the metric extracts the letter from it

    def declined(self, example: Example, reply: str) -> bool:
        return is_declined(reply) and extract_answer(reply) is None  # a chosen letter answers


FORMATS: dict[str, PromptFormat] = {f.name: f for f in (PromptFormat(), LongBenchV2Format())}
RAGBENCH = FORMATS["ragbench"]
BY_SOURCE = {"longbench_v2": lb2.PROMPT_FORMAT}  # meta["source"] of files imported before


def prompt_format(example: Example) -> PromptFormat:
    """The format ``example`` names in ``meta["prompt_format"]`` (none: its source's, else
    ``ragbench``)."""
    meta = example.meta
    name = meta.get("prompt_format") or BY_SOURCE.get(str(meta.get("source"))) or RAGBENCH.name
    if name not in FORMATS:
        raise unknown(f"prompt format of example {example.id!r}", str(name), FORMATS)
    return FORMATS[name]


def check_cot(points: Sequence[StrategyParams], examples: Sequence[Example]) -> None:
    """Raise ValueError (naming the formats that have one) when a ``cot: true`` point meets an
    example whose prompt format has no chain-of-thought protocol: every such record could only
    fail, so a run (and its dry run) stops before anything is sent."""
    labels = [p.label() for p in points if getattr(p, "cot", False)]
    for example in examples if labels else ():
        try:
            prompt_format(example).require_cot()
        except ValueError as exc:
            raise ValueError(f"{', '.join(labels)}: example {example.id!r}: {exc}") from None
