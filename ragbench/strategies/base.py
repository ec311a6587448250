"""What every strategy shares: the run's resources, requests in the answer format, records.

A strategy is written once as *steps*: a generator that yields the ``GenerationRequest`` it needs,
receives the ``Completion`` and finally returns the ``Record`` (``driver.run_batch`` runs many
together). ``Steps`` is that generator's type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from ragbench.cost.accounting import Cost
from ragbench.cost.alone import PrefixLedger
from ragbench.cost.prices import PriceSheet
from ragbench.llm.base import LLM
from ragbench.llm.cost_model import Rates
from ragbench.metrics.answer import score
from ragbench.models import ModelPreset
from ragbench.strategies.params import RetrievalParams, StrategyParams
from ragbench.strategies.prompt_format import RAGBENCH, Frame, PromptFormat, prompt_format
from ragbench.types import Completion, Example, GenerationRequest, Record

Steps = Generator[GenerationRequest, Completion, Record]  # yields requests, returns the Record
Answer = Generator[GenerationRequest, Completion, tuple[Completion, Cost, dict[str, object]]]
# (example, retrieval settings) -> (chunks, retriever); the runner memoises built indexes
IndexFn = Callable[[Example, RetrievalParams], tuple[list, Any]]


@dataclass
class Resources:
    """What a strategy needs besides the example; built once per run by the runner."""

    llm: LLM  # the model under test (possibly a CachedLLM; a dry run's token counter)
    metrics: tuple[str, ...] = ("string_match_all",)
    max_new_tokens: int = 32
    prompt_budget: int | None = None  # matched budgets: prompt-token cap for every strategy
    preset: ModelPreset | None = None  # the architecture, for FLOPs / KV bytes
    kv_dtype: str | None = None  # dtype the KV cache is stored in; None: 2 bytes/value assumed
    sheet: PriceSheet | None = None  # for dollars (None: no dollar column)
    # the model's calibration (None: none, a server or the fake backend): its modelled seconds
    # are what an hourly sheet charges under cost_basis "calibrated"
    rates: Rates | None = None
    cost_basis: str = "calibrated"  # calibrated | measured (the config's cost_basis)
    index: IndexFn | None = None
    # long context over a shared corpus: the corpus fitted to the window once per run, keyed by
    # (corpus fingerprint, overflow policy, prompt frame), so every question gets the same prefix
    fitted: dict[tuple, tuple] = field(default_factory=dict, repr=False)
    # long_context preload (strategies/preload.py): per preload group, the preload call's Cost
    # (or its error), and how many questions of the run share it (set by the runner)
    preloaded: dict[tuple, Any] = field(default_factory=dict, repr=False)
    preload_over: dict[tuple, int] = field(default_factory=dict, repr=False)
    # each variant priced as if it ran alone: which prompt prefixes each variant (label) has sent
    # (``ragbench.cost.alone``); run_batch and drive pass every completion through it
    alone: PrefixLedger = field(default_factory=PrefixLedger, repr=False)

    def limit(self, new_tokens: int | None = None) -> int:
        """Prompt tokens allowed: the window minus the answer (``new_tokens``, default the run's
        ``max_new_tokens``), capped by the matched budget."""
        window = self.llm.context_window - (new_tokens or self.max_new_tokens)
        return min(window, self.prompt_budget) if self.prompt_budget else window

    def new_tokens(self, fmt: PromptFormat, reasoning: bool = False) -> int:
        """New tokens a call may generate: the format's reasoning budget for a chain-of-thought
        call, else the run's ``max_new_tokens``."""
        return (fmt.cot_tokens or self.max_new_tokens) if reasoning else self.max_new_tokens

    def request(
        self,
        prompt: str,
        prefix: str = "",
        rid: str = "",
        fmt: PromptFormat = RAGBENCH,
        reasoning: bool = False,
    ) -> GenerationRequest:
        """A request in ``fmt``'s answer format (greedy); a ``reasoning`` call (the first of
        chain of thought) has the format's reasoning budget and no stop string."""
        return GenerationRequest(
            prompt=prompt,
            prefix=prefix,
            max_new_tokens=self.new_tokens(fmt, reasoning),
            stop=() if reasoning else fmt.stop,
            id=rid,
        )

    def prompt_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` alone, chat template included."""
        return self.llm.prompt_tokens(
            GenerationRequest(prompt=text, max_new_tokens=self.max_new_tokens)
        )

    def room(self, frame: Frame, new_tokens: int | None = None) -> int:
        """Context tokens that fit in ``frame`` within the limit."""
        return self.limit(new_tokens) - self.prompt_tokens(frame.prompt(""))

    def excess(self, context: str, frame: Frame, new_tokens: int | None = None) -> int:
        """Tokens by which ``frame`` around ``context`` exceeds the limit (<= 0: it fits). Token
        counts are not additive across the joins, so callers re-measure and cut by this until
        it fits."""
        return self.prompt_tokens(frame.prompt(context)) - self.limit(new_tokens)

    def cost(self, completion: Completion) -> Cost:
        return Cost.of(
            completion, self.preset, self.sheet, self.kv_dtype, self.rates, self.cost_basis
        )


def make_record(
    example: Example,
    params: StrategyParams,
    completion: Completion,
    res: Resources,
    meta: dict[str, object],
    cost: Cost | None = None,
    prediction: str | None = None,
) -> Record:
    """The record of ``completion``; what is scored is ``prediction`` when given (a pipeline's
    own answer, whole), else the example format's reading of the reply (ragbench's prompts ask
    for one line: ``PromptFormat.prediction``). ``meta["raw"]`` keeps the reply as it came."""
    if prediction is None:
        prediction = prompt_format(example).prediction(example, completion.text)
    scored = any(a.strip() for a in example.answers)  # a question without gold: unscored
    # the device its answer was computed on, where the backend says (transformers: cpu, cuda);
    # a cached completion keeps the device of the run that computed it, as it keeps its cost
    device = (completion.meta or {}).get("device")
    return Record(
        example_id=example.id,
        strategy=params.strategy,
        params=params,
        prediction=prediction,
        answers=example.answers,
        scores=dict(score(prediction, example.answers, res.metrics, example.meta))
        if scored
        else {},
        cost=cost or res.cost(completion),
        meta={
            "raw": completion.text,
            **({"device": device} if device else {}),
            # replayed from the completion cache: its tokens, seconds and dollars are the run's
            # that computed it (what the answer costs), not what this rerun spent (nothing)
            **({"from_cache": True} if completion.cached else {}),
            **meta,
            **({} if scored else {"unscored": True}),
        },
    )


def answer(example: Example, res: Resources, request: GenerationRequest, cot: bool) -> Answer:
    """Send a strategy's ``request`` and return (the answer's completion, the cost, meta). Under
    ``cot`` the request is the reasoning call: its reply goes back in the example format's
    answer step (a second call), whose reply is the answer; the cost is both calls'."""
    first = yield request
    if not cot:
        return first, res.cost(first), {}
    fmt = prompt_format(example)
    step = res.request(fmt.cot_answer(example, first.text), rid=f"{request.id}:answer", fmt=fmt)
    second = yield dataclasses.replace(step, kv=request.kv)  # the point's KV technique, both calls
    return second, res.cost(first) + res.cost(second), {"cot_reasoning": first.text}
