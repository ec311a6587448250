"""Many strategies' steps together: each round's requests go to the LLM in one ``generate`` call,
so the backend can batch them (padded batches and shared document prefixes on transformers,
concurrent requests on an OpenAI-compatible server). Rounds depend only on the items given:
results are deterministic."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ragbench.strategies.base import Resources, Steps
from ragbench.strategies.driver import FailedAfterPaying, advance, outcomes
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.preload import ensure
from ragbench.strategies.registry import get_strategy
from ragbench.types import Completion, Example, GenerationRequest, Record


def run_batch(
    items: Sequence[tuple[Example, StrategyParams]], res: Resources
) -> list[Record | Exception]:
    """Run (example, params) items together (the params name their strategy); each round's
    requests go to the LLM in one ``generate`` call. Returns a Record or the exception per item,
    in order: one failing item never stops the others. If the batched call fails, each request
    gets its own outcome (see ``outcomes``). An item that fails after some of its calls finished
    returns ``FailedAfterPaying`` with what they cost."""
    ensure(items, res)  # long_context preload: the corpus KV before its questions
    results: list[Record | Exception | None] = [None] * len(items)
    waiting: dict[int, tuple[Steps, GenerationRequest]] = {}
    finished: dict[int, list[Completion]] = {}  # each item's answered calls, as charged

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
        # each request names its variant: the backend shares undeclared prefixes within one
        requests = [dataclasses.replace(waiting[i][1], variant=items[i][1].label()) for i in round_]
        try:
            completions: list[Completion | Exception] = list(res.llm.generate(requests))
        except Exception as exc:
            completions = outcomes(res.llm, requests, exc)
        current = {i: waiting.pop(i)[0] for i in round_}
        for i, request, completion in zip(round_, requests, completions, strict=True):
            if isinstance(completion, Exception):
                current[i].close()
                results[i] = completion
            else:  # priced as if its variant ran alone (cost/alone.py)
                label = items[i][1].label()
                charged = res.alone.charge(label, request, completion)
                finished.setdefault(i, []).append(charged)
                step(i, current[i], charged)
    for i, calls in finished.items():
        if isinstance(error := results[i], Exception):
            results[i] = FailedAfterPaying(error, sum(map(res.cost, calls[1:]), res.cost(calls[0])))
    return results  # type: ignore[return-value]
