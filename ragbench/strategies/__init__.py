"""Strategies: how an example becomes a prompt, an answer, and a Record with scores and cost.

- ``closed_book``: the question alone (what the model knows without context).
- ``long_context``: the whole context, document first and question last (``overflow`` policy).
- ``rag``: retrieve, assemble within a token budget and/or top-k, answer over the chunks.
- ``self_route`` (Li et al. 2024): RAG with an "unanswerable" option; declined -> long context.
- ``retrieve_only``: no generation; documents ranked and scored against relevance judgements.

Every prompt is built in the example's prompt format (``prompt_format``: ragbench's own, or a
benchmark's official templates, and chain of thought).

Files, one job each: ``prompts`` (ragbench's templates, answer cleaning, truncation),
``prompt_format`` (formats and frames), ``params`` (one typed, frozen parameter class per
strategy: defaults, validation, grid, label; the pipeline's in ``pipeline_params``), ``base``
(resources, requests, the chain-of-thought answer step and records), ``fit`` (the whole context fitted to the window), one module per strategy (its steps),
``contexts`` (what each answer read: its source and its contexts, rebuilt on demand), ``registry``
(the ``STRATEGIES`` registry, what each strategy declares, ``Strategy.contexts``), ``driver`` and ``batch`` (running
steps, one at a time or batched).

Adding a strategy: its steps module, its parameter class (``params.py``) and one
``Strategy(...)`` line in ``registry.py`` (see there).
"""

from ragbench.strategies.base import Resources, make_record
from ragbench.strategies.batch import run_batch
from ragbench.strategies.contexts import FULL_CONTEXT, NO_CONTEXT, RETRIEVED, Contexts
from ragbench.strategies.driver import drive
from ragbench.strategies.params import (
    ClosedBookParams,
    LongContextParams,
    RagParams,
    RetrievalParams,
    SelfRouteParams,
    StrategyParams,
)
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.strategies.prompts import clean_answer, truncate
from ragbench.strategies.registry import (
    STRATEGIES,
    Strategy,
    contexts_of,
    get_strategy,
    params_from_dict,
    strategies_where,
)
from ragbench.strategies.retrieve_only import RetrieveOnlyParams

__all__ = [
    "FULL_CONTEXT",
    "NO_CONTEXT",
    "RETRIEVED",
    "STRATEGIES",
    "Contexts",
    "ClosedBookParams",
    "LongContextParams",
    "PipelineParams",
    "RagParams",
    "Resources",
    "RetrieveOnlyParams",
    "RetrievalParams",
    "SelfRouteParams",
    "Strategy",
    "StrategyParams",
    "clean_answer",
    "contexts_of",
    "drive",
    "get_strategy",
    "make_record",
    "params_from_dict",
    "run_batch",
    "strategies_where",
    "truncate",
]
