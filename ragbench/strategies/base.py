"""What every strategy shares: the run's resources, requests in the answer format, records.

A strategy is written once as *steps*: a generator that yields the ``GenerationRequest`` it needs,
receives the ``Completion`` and finally returns the ``Record`` (``driver.run_batch`` runs many
together). ``Steps`` is that generator's type.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from ragbench.cost.accounting import Cost
from ragbench.metrics.answer import score
from ragbench.strategies.params import RetrievalParams, StrategyParams
from ragbench.strategies.prompts import ANSWER_STOP, CONTEXT_TEMPLATE, clean_answer
from ragbench.types import Completion, Example, GenerationRequest, Record

Steps = Generator[GenerationRequest, Completion, Record]  # yields requests, returns the Record
# (example, retrieval settings) -> (chunks, retriever); the runner memoises built indexes
IndexFn = Callable[[Example, RetrievalParams], tuple[list, Any]]


@dataclass
class Resources:
    """What a strategy needs besides the example; built once per run by the runner."""

    llm: Any  # ragbench.llm.base.LLM (possibly a CachedLLM)
    metrics: tuple[str, ...] = ("string_match_all",)
    max_new_tokens: int = 32
    prompt_budget: int | None = None  # matched budgets: prompt-token cap for every strategy
    preset: Any = None  # ModelPreset for FLOPs / KV bytes
    kv_dtype: str | None = None  # dtype the KV cache is stored in; None: 2 bytes/value assumed
    sheet: Any = None  # PriceSheet for dollars
    # the model's calibration (llm.calibration.Rates; None: none, a server or the fake backend):
    # its modelled seconds are what an hourly sheet charges under cost_basis "calibrated"
    rates: Any = None
    cost_basis: str = "calibrated"  # calibrated | measured (the config's cost_basis)
    index: IndexFn | None = None
    # long context over a shared corpus: the corpus fitted to the window once per run, keyed by
    # (corpus fingerprint, overflow policy), so every question gets the same prefix
    fitted: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict, repr=False)
    # long_context preload (strategies/preload.py): per preload group, the preload call's Cost
    # (or its error), and how many questions of the run share it (set by the runner)
    preloaded: dict[tuple, Any] = field(default_factory=dict, repr=False)
    preload_over: dict[tuple, int] = field(default_factory=dict, repr=False)

    def limit(self) -> int:
        """Prompt tokens allowed: the window minus the answer, capped by the matched budget."""
        window = self.llm.context_window - self.max_new_tokens
        return min(window, self.prompt_budget) if self.prompt_budget else window

    def request(self, prompt: str, prefix: str = "", rid: str = "") -> GenerationRequest:
        """A request in the answer format every strategy uses (one line, greedy)."""
        return GenerationRequest(
            prompt=prompt,
            prefix=prefix,
            max_new_tokens=self.max_new_tokens,
            stop=ANSWER_STOP,
            id=rid,
        )

    def prompt_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` alone, chat template included."""
        return self.llm.prompt_tokens(
            GenerationRequest(prompt=text, max_new_tokens=self.max_new_tokens)
        )

    def room(self, tail: str) -> int:
        """Context tokens that fit before ``tail`` (the question part) within the limit."""
        return self.limit() - self.prompt_tokens(CONTEXT_TEMPLATE.format(context="") + tail)

    def excess(self, context: str, tail: str) -> int:
        """Tokens by which the assembled prompt exceeds the limit (<= 0: it fits). Token counts
        are not additive across the join, so callers re-measure and cut by this until it fits."""
        return self.prompt_tokens(CONTEXT_TEMPLATE.format(context=context) + tail) - self.limit()

    def cost(self, completion: Completion) -> Cost:
        return Cost.of(
            completion, self.preset, self.sheet, self.kv_dtype, self.rates, self.cost_basis
        )


def make_record(
    example: Example,
    params: StrategyParams,
    completion: Completion,
    res: Resources,
    meta: dict[str, Any],
    cost: Cost | None = None,
) -> Record:
    prediction = clean_answer(completion.text, example.question)
    scored = any(a.strip() for a in example.answers)  # a question without gold: unscored
    return Record(
        example_id=example.id,
        strategy=params.strategy,
        params=params,
        prediction=prediction,
        answers=example.answers,
        scores=score(prediction, example.answers, res.metrics, example.meta) if scored else {},
        cost=cost or res.cost(completion),
        meta={"raw": completion.text, **meta, **({} if scored else {"unscored": True})},
    )
