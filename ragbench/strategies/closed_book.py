"""Closed book: the question alone, what the model knows without context."""

from __future__ import annotations

from ragbench.strategies.base import Resources, Steps, answer, make_record
from ragbench.strategies.params import ClosedBookParams
from ragbench.strategies.prompt_format import prompt_format
from ragbench.types import Example


def closed_book_steps(example: Example, res: Resources, params: ClosedBookParams) -> Steps:
    fmt = prompt_format(example)
    prompt = fmt.closed_book(example, params.cot)
    request = res.request(prompt, rid=f"{example.id}:closed_book", fmt=fmt, reasoning=params.cot)
    completion, cost, meta = yield from answer(example, res, request, params.cot)
    return make_record(example, params, completion, res, meta, cost)
