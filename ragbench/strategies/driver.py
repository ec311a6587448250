"""Driving a strategy's steps: one request at a time (``drive``), one step (``advance``), and each
request's own outcome when a batched call failed (``outcomes``). Many strategies' steps together,
round by round, are ``batch.run_batch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragbench.llm.base import LLM
from ragbench.strategies.base import Steps
from ragbench.types import Completion, GenerationRequest, Record


class FailedAfterPaying(Exception):
    """A query that failed after some of its calls had finished (Self-Route's RAG call, then
    its long-context call over the window): the ``error``, and the ``cost`` of the finished
    calls, spent all the same, so the error record carries it and a budget counts it."""

    def __init__(self, error: BaseException, cost: object) -> None:
        super().__init__(str(error))
        self.error, self.cost = error, cost

    def __reduce__(self) -> tuple:  # across processes (sweep workers, Ray) with both parts
        return FailedAfterPaying, (self.error, self.cost)


def outcome_parts(outcome: Any) -> tuple[BaseException | None, Any]:
    """(its error or None, its cost or None) of one ``run_batch`` outcome: a Record's cost; a
    plain error's none; a ``FailedAfterPaying``'s error unwrapped, with its finished calls'
    cost. Every reader of outcomes goes through this, so a wrapped error is never mistaken for
    another kind (an over-window failure) or its spend dropped."""
    if isinstance(outcome, FailedAfterPaying):
        return outcome.error, outcome.cost
    if isinstance(outcome, BaseException):
        return outcome, None
    return None, outcome.cost


def advance(steps: Steps, completion: Completion | None) -> GenerationRequest | Record:
    """The next request of ``steps`` or its Record; the strategy's own errors propagate."""
    try:
        return next(steps) if completion is None else steps.send(completion)
    except StopIteration as finished:
        return finished.value


def drive(
    steps: Steps,
    llm: LLM,
    charge: Callable[[GenerationRequest, Completion], Completion] | None = None,
) -> Record:
    """Run a strategy's steps one request at a time; ``charge`` (the run's
    ``PrefixLedger.charge`` for the variant) sees each completion before the strategy does."""
    out = advance(steps, None)
    while isinstance(out, GenerationRequest):
        completion = llm.generate([out])[0]
        out = advance(steps, charge(out, completion) if charge else completion)
    return out


def outcomes(
    llm: LLM, requests: list[GenerationRequest], exc: Exception
) -> list[Completion | Exception]:
    """Each request's completion or error after ``llm.generate(requests)`` raised ``exc``.

    Retries belong to the backend, so a request it has already given up on is never sent again
    (a resend would repeat all its retries). When ``exc.partial`` says which requests finished
    (the HTTP backend, the completion cache), those keep their completions and the others get
    their own error from ``exc.errors`` or else ``exc``, unsent. Only a failure that says nothing
    about single requests (a transformers OOM, a window overflow found before anything ran) is
    isolated by running the requests one by one."""
    partial = getattr(exc, "partial", None)
    if isinstance(partial, dict):
        errors = getattr(exc, "errors", None) or {}
        return [partial[i] if i in partial else errors.get(i, exc) for i in range(len(requests))]
    out: list[Completion | Exception] = []
    for request in requests:
        try:
            out.append(llm.generate([request])[0])
        except Exception as one:
            out.append(one)
    return out
