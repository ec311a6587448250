"""The strategy registry: one ``Strategy(...)`` line per strategy, naming its steps, its
parameter class and what its answers read.

Adding a strategy: write its steps (a generator: yield ``res.request(...)``, receive the
``Completion``, return ``make_record(...)``) in its own module and its parameter class in
``params.py``, and register one line in ``STRATEGIES`` below. That line also declares what the
strategy's answers read (``context``: nothing, retrieved chunks or the whole context; or
``routes`` for a router whose records name the branch that answered) and how to rebuild that
context (``rebuild_context``: as the prompt placed it; ``rebuild_contexts``: the retrieved
contexts, one each). ``Strategy.contexts`` (``contexts_of`` for any record or table row) turns
these into one ``contexts.Contexts``: the judge, failure attribution and the noise pass read
it, never the strategy's name. ``rebuild_prompts`` gives the prompt of each of its calls
again (the exports read it); a strategy without one says why from what it declares (it
generates nothing, or an external system builds its own prompts). A strategy that depends on something outside the run
(``pipeline``: the user's endpoint) declares a ``preflight``, which the runner calls once per
parameter point before any work (``preflight_points``), so a dead endpoint fails the run at once.
A strategy whose prompts hold less than the whole example declares a ``context_bound`` (closed
book: none; RAG: its retrieval budget), so a run's calibration probes no further than its
requests reach (``resources.longest_prompt``); without one it is bounded by the whole example.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ragbench.registry import Registry
from ragbench.strategies.base import Resources, Steps
from ragbench.strategies.closed_book import closed_book_steps
from ragbench.strategies.contexts import (
    FULL_CONTEXT,
    NO_CONTEXT,
    RETRIEVED,
    SOURCES,
    Contexts,
    ContextUnavailable,
    ResourcesFn,
    closed_book_prompts,
    long_context_context,
    long_context_prompts,
    no_context,
    pipeline_context,
    pipeline_contexts,
    rag_context,
    rag_prompts,
    retrieved_contexts,
    self_route_context,
    self_route_prompts,
)
from ragbench.strategies.driver import drive
from ragbench.strategies.long_context import long_context_steps
from ragbench.strategies.params import (
    ClosedBookParams,
    LongContextParams,
    RagParams,
    SelfRouteParams,
    StrategyParams,
)
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.strategies.pipeline.strategy import OWN_INDEX, RUN_CORPUS, pipeline_steps, preflight
from ragbench.strategies.rag import rag_context_bound, rag_steps
from ragbench.strategies.retrieve_only import RetrieveOnlyParams, retrieve_only_steps
from ragbench.strategies.self_route import self_route_steps
from ragbench.types import Example, Record

# a record, or a results-table row (its meta flattened into columns)
RecordOrRow = Record | Mapping[str, object]


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
    # (example, record, resources thunk) -> the context text the model read, as its prompt
    # placed it (None: none); raises ContextUnavailable when it cannot be rebuilt faithfully;
    # None: nothing to rebuild (a strategy that reads NO_CONTEXT reads None)
    rebuild_context: Callable[[Example, Record, ResourcesFn], str | None] | None = None
    # (example, record, resources thunk) -> its retrieved contexts, one text each, best first
    # (None: none); None: it retrieves nothing the judge's context metrics could rate
    rebuild_contexts: Callable[[Example, Record, ResourcesFn], list[str] | None] | None = None
    # (example, record, resources thunk) -> the prompt of each call the answer took, in order
    # (raises ContextUnavailable when they cannot be rebuilt faithfully); None: none to rebuild
    rebuild_prompts: Callable[[Example, Record, ResourcesFn], list[str]] | None = None
    # (params) -> None, once per parameter point with work to do, before any work: raises
    # (ServerUnreachable, ValueError) when the point cannot run (a dead endpoint)
    preflight: Callable[[Any], None] | None = None  # takes the strategy's own params class
    # answers by calling a system outside ragbench (the user's pipeline): a dry run, which
    # sends nothing, cannot count or price it
    external: bool = False
    # (params) -> the most context tokens (the model's) one of its prompts holds besides the
    # question and the template: how far the run's calibration probes (``longest_prompt``).
    # None: no bound short of the whole example (long context; Self-Route, which can fall back
    # to it; a pipeline, which builds its own prompts; any strategy that declares none)
    context_bound: Callable[[Any], int] | None = None  # the strategy's own params class

    def contexts(
        self,
        record: RecordOrRow,
        example: Example | None = None,
        resources: ResourcesFn | None = None,
    ) -> Contexts:
        """What ``record`` (or a results-table row) read (``contexts.Contexts``): the source that
        answered (its ``context``, or for a router the branch its ``route`` names), where that
        call's facts are, whether it read the run's corpus, and its contexts, rebuilt on demand
        from ``example`` and the run's resources (``resources``: a thunk, called only when a
        rebuild needs them)."""
        facts = record.meta if isinstance(record, Record) else record
        source = self.context
        if self.routes:
            route = facts.get("route")
            source = route if route in SOURCES else RETRIEVED
        text, texts = self.rebuild_context, self.rebuild_contexts
        if text is None and self.context == NO_CONTEXT:
            text = no_context
        prompts = self.rebuild_prompts or self._no_prompts
        res = resources if resources is not None else _no_resources
        # a rebuild reads a Record and its Example: asked of a table row or without the
        # example, it fails when called (the rebuilds are lazy; a row's Contexts rarely asks)
        return Contexts(
            strategy=self.name,
            source=source,
            meta_prefix="lc_" if self.routes and source == FULL_CONTEXT else "",
            corpus_note=self._corpus_note(facts),
            rebuild_text=None if text is None else lambda: text(example, record, res),  # type: ignore[arg-type]
            rebuild_texts=None if texts is None else lambda: texts(example, record, res),  # type: ignore[arg-type]
            rebuild_prompts=lambda: prompts(example, record, res),  # type: ignore[arg-type]
        )

    def _no_prompts(self, example: Example, record: Record, res: ResourcesFn) -> list[str]:
        """Why a strategy without ``rebuild_prompts`` has no prompt to give, from what it
        declares: the reason is per strategy, never a guess at what was sent."""
        if not self.generates:
            raise ContextUnavailable(f"{self.name} sends no prompt: it calls no model")
        if self.external:
            raise ContextUnavailable(
                f"{self.name}: the system under test builds its own prompts; ragbench never "
                "sees them"
            )
        raise ContextUnavailable(f"strategy {self.name!r} declares no prompt to rebuild")

    def _corpus_note(self, facts: Mapping[str, object]) -> str | None:
        """Why an answer of this strategy read no corpus the run indexes or hands to it."""
        if facts.get("pipeline_index") == OWN_INDEX:
            return "the pipeline answers from its own index, not the run's documents"
        if self.needs_retrieval or facts.get("pipeline_index") == RUN_CORPUS:
            return None
        if self.context == NO_CONTEXT:
            return "reads no documents"
        if self.context == FULL_CONTEXT:
            return "reads the whole context, not a retrieved corpus"
        return "answers from no corpus ragbench indexes or hands to it"

    def run(self, example: Example, res: Resources, params: StrategyParams | None = None) -> Record:
        """One example, one request at a time (``run_batch`` runs many together)."""
        params = params or self.params()
        label = params.label()
        return drive(
            self.steps(example, res, params), res.llm, lambda r, c: res.alone.charge(label, r, c)
        )

    def grid(
        self, spec: Mapping[str, object], retrieval: Mapping[str, object] | None = None
    ) -> list:
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
                rebuild_prompts=closed_book_prompts,
                context_bound=lambda params: 0,  # the question alone
            ),
            Strategy(
                "long_context",
                long_context_steps,
                LongContextParams,
                context=FULL_CONTEXT,
                rebuild_context=long_context_context,
                rebuild_prompts=long_context_prompts,
            ),
            Strategy(
                "rag",
                rag_steps,
                RagParams,
                needs_retrieval=True,
                context=RETRIEVED,
                rebuild_context=rag_context,
                rebuild_contexts=retrieved_contexts,
                rebuild_prompts=rag_prompts,
                context_bound=rag_context_bound,  # its retrieval budget
            ),
            Strategy(
                "self_route",
                self_route_steps,
                SelfRouteParams,
                needs_retrieval=True,
                routes=True,
                rebuild_context=self_route_context,
                rebuild_contexts=retrieved_contexts,  # its RAG call's chunks, routed or not
                rebuild_prompts=self_route_prompts,
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
                rebuild_contexts=pipeline_contexts,
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


def strategies_where(**declared: object) -> list[str]:
    """Names of the registered strategies whose declarations match, e.g.
    ``strategies_where(context=NO_CONTEXT)`` or ``strategies_where(routes=True)``."""
    return [
        name
        for name in STRATEGIES
        if all(getattr(STRATEGIES.get(name), k) == v for k, v in declared.items())
    ]


def contexts_of(
    record: RecordOrRow, example: Example | None = None, resources: ResourcesFn | None = None
) -> Contexts:
    """What a record or results-table row read: its strategy's ``Strategy.contexts``. A strategy
    this version does not know (an older table) is read by its row: RETRIEVED when it has a
    ``gold_hit``, else no known source, and nothing to rebuild."""
    name = str(record.strategy if isinstance(record, Record) else record.get("strategy"))
    if name in STRATEGIES:
        return STRATEGIES.get(name).contexts(record, example, resources)
    facts = record.meta if isinstance(record, Record) else record
    gold_hit = facts.get("gold_hit")
    known = gold_hit is not None and gold_hit == gold_hit
    return Contexts(
        name, RETRIEVED if known else None, corpus_note="a strategy ragbench does not know"
    )


def _no_resources() -> Resources:
    raise ContextUnavailable("the run's resources (model, index) are not at hand to rebuild it")


def params_from_dict(strategy: str, data: Mapping[str, object]) -> StrategyParams:
    """A stored parameter point (a record's ``params``) back as its typed class."""
    return get_strategy(strategy).params.from_dict(data)
