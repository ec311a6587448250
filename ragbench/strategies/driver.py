"""Drivers: run strategies' steps, one request at a time (``drive``) or many together
(``run_batch``: each round's requests go to the LLM in one ``generate`` call, so the backend can
batch them: padded batches and shared document prefixes on transformers, concurrent requests on
an OpenAI-compatible server). Rounds depend only on the items given: results are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragbench.strategies.base import Resources, Steps
from ragbench.strategies.params import StrategyParams
from ragbench.types import Completion, Example, GenerationRequest, Record


def advance(steps: Steps, completion: Completion | None) -> GenerationRequest | Record:
    """The next request of ``steps`` or its Record; the strategy's own errors propagate."""
    try:
        return next(steps) if completion is None else steps.send(completion)
    except StopIteration as finished:
        return finished.value


def drive(steps: Steps, llm: Any) -> Record:
    """Run a strategy's steps one request at a time."""
    out = advance(steps, None)
    while isinstance(out, GenerationRequest):
        out = advance(steps, llm.generate([out])[0])
    return out


def outcomes(
    llm: Any, requests: list[GenerationRequest], exc: Exception
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


def run_batch(
    items: Sequence[tuple[Example, StrategyParams]], res: Resources
) -> list[Record | Exception]:
    """Run (example, params) items together (the params name their strategy); each round's
    requests go to the LLM in one ``generate`` call. Returns a Record or the exception per item,
    in order: one failing item never stops the others. If the batched call fails, each request
    gets its own outcome (see ``outcomes``)."""
    from ragbench.strategies import get_strategy, preload

    preload.ensure(items, res)  # long_context preload: the corpus KV before its questions
    results: list[Record | Exception | None] = [None] * len(items)
    waiting: dict[int, tuple[Steps, GenerationRequest]] = {}

    def step(i: int, steps: Steps, completion: Completion | None) -> None:
        try:
            out = advance(steps, completion)
        except Exception as exc:  # the strategy failed: an error record for this item only
            results[i] = exc
            return
        if isinstance(out, GenerationRequest):
            waiting[i] = (steps, out)
        else:
            results[i] = out

    for i, (example, params) in enumerate(items):
        try:
            steps = get_strategy(params.strategy).steps(example, res, params)
        except Exception as exc:
            results[i] = exc
            continue
        step(i, steps, None)
    while waiting:
        round_ = sorted(waiting)
        requests = [waiting[i][1] for i in round_]
        try:
            completions: list[Completion | Exception] = list(res.llm.generate(requests))
        except Exception as exc:
            completions = outcomes(res.llm, requests, exc)
        current = {i: waiting.pop(i)[0] for i in round_}
        for i, completion in zip(round_, completions, strict=True):
            if isinstance(completion, Exception):
                current[i].close()
                results[i] = completion
            else:
                step(i, current[i], completion)
    return results  # type: ignore[return-value]
