"""Strategies: how an example becomes a prompt, an answer, and a Record with scores and cost.

- ``closed_book``: the question alone (what the model knows without context).
- ``long_context``: the whole context, document first and question last (``overflow`` policy).
- ``rag``: retrieve, assemble within a token budget and/or top-k, answer with the same template.
- ``self_route`` (Li et al. 2024): RAG with an "unanswerable" option; declined -> long context.
- ``retrieve_only``: no generation; documents ranked and scored against relevance judgements.

Files, one job each: ``prompts`` (templates, answer cleaning, truncation), ``params`` (one typed,
frozen parameter class per strategy: defaults, validation, grid, label), ``base`` (resources and
records), one module per strategy (its steps), ``driver`` (running steps, batched).

Adding a strategy: write its steps (a generator: yield ``res.request(...)``, receive the
``Completion``, return ``make_record(...)``) and its parameter class, and register one line in
``STRATEGIES`` below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ragbench.registry import Registry
from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.closed_book import closed_book_steps
from ragbench.strategies.driver import drive, run_batch
from ragbench.strategies.long_context import long_context_steps
from ragbench.strategies.params import (
    ClosedBookParams,
    LongContextParams,
    RagParams,
    RetrievalParams,
    SelfRouteParams,
    StrategyParams,
)
from ragbench.strategies.prompts import clean_answer, truncate
from ragbench.strategies.rag import rag_steps
from ragbench.strategies.retrieve_only import RetrieveOnlyParams, retrieve_only_steps
from ragbench.strategies.self_route import self_route_steps
from ragbench.types import Example, Record


@dataclass(frozen=True)
class Strategy:
    name: str
    steps: Callable[..., Steps]  # (example, res, params) -> Steps
    params: type[StrategyParams]
    needs_retrieval: bool = False  # builds an index: the run validates its retrieval settings
    generates: bool = True  # calls the LLM (retrieve_only does not: no model, no answer metrics)

    def run(self, example: Example, res: Resources, params: StrategyParams | None = None) -> Record:
        """One example, one request at a time (``run_batch`` runs many together)."""
        return drive(self.steps(example, res, params or self.params()), res.llm)

    def grid(self, spec: Mapping[str, Any], retrieval: Mapping[str, Any] | None = None) -> list:
        """Parameter points of ``spec`` (a config's ``params``; list values are axes); strategies
        that retrieve also expand the run's ``retrieval`` settings."""
        return self.params.grid(spec, retrieval if self.needs_retrieval else None)


STRATEGIES = Registry(
    "strategy",
    {
        s.name: s
        for s in (
            Strategy("closed_book", closed_book_steps, ClosedBookParams),
            Strategy("long_context", long_context_steps, LongContextParams),
            Strategy("rag", rag_steps, RagParams, needs_retrieval=True),
            Strategy("self_route", self_route_steps, SelfRouteParams, needs_retrieval=True),
            Strategy(
                "retrieve_only",
                retrieve_only_steps,
                RetrieveOnlyParams,
                needs_retrieval=True,
                generates=False,
            ),
        )
    },
)


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.get(name)


def params_from_dict(strategy: str, data: Mapping[str, Any]) -> StrategyParams:
    """A stored parameter point (a record's ``params``) back as its typed class."""
    return get_strategy(strategy).params.from_dict(data)


__all__ = [
    "STRATEGIES",
    "ClosedBookParams",
    "LongContextParams",
    "RagParams",
    "Resources",
    "RetrievalParams",
    "SelfRouteParams",
    "Strategy",
    "StrategyParams",
    "clean_answer",
    "drive",
    "get_strategy",
    "make_record",
    "params_from_dict",
    "run_batch",
    "truncate",
]
