"""Closed book: the question alone, what the model knows without context."""

from __future__ import annotations

from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.params import ClosedBookParams
from ragbench.strategies.prompts import CLOSED_BOOK_TEMPLATE, INSTRUCTIONS, task_type
from ragbench.types import Example


def closed_book_steps(example: Example, res: Resources, params: ClosedBookParams) -> Steps:
    prompt = CLOSED_BOOK_TEMPLATE.format(
        instruction=INSTRUCTIONS[task_type(example)], question=example.question
    )
    completion = yield res.request(prompt, rid=f"{example.id}:closed_book")
    return make_record(example, params, completion, res, {})
