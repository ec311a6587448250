"""The strategy registry: one ``Strategy(...)`` line per strategy, naming its steps, its
parameter class and what its answers read.

Adding a strategy: write its steps (a generator: yield ``res.request(...)``, receive the
``Completion``, return ``make_record(...)``) in its own module and its parameter class in
``params.py``, and register one line in ``STRATEGIES`` below. That line also declares what the
strategy's answers read (``context``: nothing, retrieved chunks or the whole context; or
``routes`` for a router whose records name the branch that answered) and how to rebuild that
context for the judge (``rebuild_context``); failure attribution and the judge read these
declarations, never the strategy's name. A strategy that depends on something outside the run
(``pipeline``: the user's endpoint) declares a ``preflight``, which the runner calls once per
parameter point before any work (``preflight_points``), so a dead endpoint fails the run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ragbench.registry import Registry
from ragbench.strategies.base import Resources, Steps
from ragbench.strategies.closed_book import closed_book_steps
from ragbench.strategies.driver import drive
from ragbench.strategies.given_context import (
    ContextUnavailable,
    long_context_context,
    no_context,
    pipeline_context,
    rag_context,
    self_route_context,
)
from ragbench.strategies.long_context import long_context_steps
from ragbench.strategies.params import (
    ClosedBookParams,
    LongContextParams,
    RagParams,
    SelfRouteParams,
    StrategyParams,
)
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.strategies.pipeline.strategy import pipeline_steps, preflight
from ragbench.strategies.rag import rag_steps
from ragbench.strategies.retrieve_only import RetrieveOnlyParams, retrieve_only_steps
from ragbench.strategies.self_route import self_route_steps
from ragbench.types import Example, Record

# What an answer was read from: the sources failure attribution explains misses by.
NO_CONTEXT = "closed_book"  # the question alone
RETRIEVED = "rag"  # retrieved chunks
FULL_CONTEXT = "long_context"  # the whole (possibly truncated) context
SOURCES = (NO_CONTEXT, RETRIEVED, FULL_CONTEXT)


@dataclass(frozen=True)
class Strategy:
    name: str
    steps: Callable[..., Steps]  # (example, res, params) -> Steps
    params: type[StrategyParams]
    needs_retrieval: bool = False  # builds an index: the run validates its retrieval settings
    generates: bool = True  # calls the LLM (retrieve_only does not: no model, no answer metrics)
    # what its answers read: NO_CONTEXT | RETRIEVED | FULL_CONTEXT (None: no answer, or a router)
    context: str | None = None
    # a router: each record's ``route`` names the source that answered (RETRIEVED unless routed)
    routes: bool = False
    # (example, record, res) -> the context text the model read (None: none), for judge_faithful;
    # raises ContextUnavailable when it cannot be rebuilt faithfully; None: nothing to rebuild
    rebuild_context: Callable[[Example, Record, Resources], str | None] | None = None
    # (params) -> None, once per parameter point with work to do, before any work: raises
    # (ServerUnreachable, ValueError) when the point cannot run (a dead endpoint)
    preflight: Callable[[StrategyParams], None] | None = None
    # answers by calling a system outside ragbench (the user's pipeline): a dry run, which
    # sends nothing, cannot count or price it
    external: bool = False

    def answer_source(self, row: Mapping[str, Any]) -> str | None:
        """The source that produced the answer of a record (or results-table row) of this
        strategy: its ``context``, or for a router the branch the row's ``route`` names."""
        if self.routes:
            route = row.get("route")
            return route if route in SOURCES else RETRIEVED
        return self.context

    def given_context(self, example: Example, record: Record, res: Resources) -> str | None:
        """The context the model read for ``record`` (None: it read none)."""
        if self.rebuild_context is None:
            raise ContextUnavailable(f"strategy {self.name!r} declares no context to rebuild")
        return self.rebuild_context(example, record, res)

    def run(self, example: Example, res: Resources, params: StrategyParams | None = None) -> Record:
        """One example, one request at a time (``run_batch`` runs many together)."""
        params = params or self.params()
        label = params.label()
        return drive(
            self.steps(example, res, params), res.llm, lambda r, c: res.alone.charge(label, r, c)
        )

    def grid(self, spec: Mapping[str, Any], retrieval: Mapping[str, Any] | None = None) -> list:
        """Parameter points of ``spec`` (a config's ``params``; list values are axes); strategies
        that retrieve also expand the run's ``retrieval`` settings."""
        return self.params.grid(spec, retrieval if self.needs_retrieval else None)


STRATEGIES = Registry(
    "strategy",
    {
        s.name: s
        for s in (
            Strategy(
                "closed_book",
                closed_book_steps,
                ClosedBookParams,
                context=NO_CONTEXT,
                rebuild_context=no_context,
            ),
            Strategy(
                "long_context",
                long_context_steps,
                LongContextParams,
                context=FULL_CONTEXT,
                rebuild_context=long_context_context,
            ),
            Strategy(
                "rag",
                rag_steps,
                RagParams,
                needs_retrieval=True,
                context=RETRIEVED,
                rebuild_context=rag_context,
            ),
            Strategy(
                "self_route",
                self_route_steps,
                SelfRouteParams,
                needs_retrieval=True,
                routes=True,
                rebuild_context=self_route_context,
            ),
            Strategy(
                "retrieve_only",
                retrieve_only_steps,
                RetrieveOnlyParams,
                needs_retrieval=True,
                generates=False,
            ),
            Strategy(
                "pipeline",
                pipeline_steps,
                PipelineParams,
                context=RETRIEVED,
                rebuild_context=pipeline_context,
                preflight=preflight,
                external=True,
            ),
        )
    },
)


def preflight_points(points: Iterable[StrategyParams]) -> None:
    """Each distinct point's ``Strategy.preflight``, in order; the first failure raises."""
    for params in dict.fromkeys(points):
        check = get_strategy(params.strategy).preflight
        if check is not None:
            check(params)


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.get(name)


def strategies_where(**declared: Any) -> list[str]:
    """Names of the registered strategies whose declarations match, e.g.
    ``strategies_where(context=NO_CONTEXT)`` or ``strategies_where(routes=True)``."""
    return [
        name
        for name in STRATEGIES
        if all(getattr(STRATEGIES.get(name), k) == v for k, v in declared.items())
    ]


def answer_source(row: Mapping[str, Any]) -> str | None:
    """Which source answered a results-table row (``Strategy.answer_source``); a strategy this
    version does not know (an older table) is attributed by its row: RETRIEVED when it has a
    ``gold_hit``, else None."""
    name = str(row.get("strategy"))
    if name in STRATEGIES:
        return STRATEGIES.get(name).answer_source(row)
    gold_hit = row.get("gold_hit")
    return RETRIEVED if gold_hit is not None and gold_hit == gold_hit else None


def params_from_dict(strategy: str, data: Mapping[str, Any]) -> StrategyParams:
    """A stored parameter point (a record's ``params``) back as its typed class."""
    return get_strategy(strategy).params.from_dict(data)
