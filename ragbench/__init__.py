"""ragbench: retrieval vs long-context prompting, accuracy and cost per query.

Importing the package is cheap: no torch, transformers or faiss until a backend is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

from ragbench.types import (  # noqa: E402
    Chunk,
    Completion,
    Document,
    Example,
    GenerationRequest,
    Record,
    ScoredChunk,
)

_LAZY = {
    "run": "ragbench.workspace.tracking:run",  # the runner's run, then MLflow if configured
    "assert_run": "ragbench.analysis.gate:assert_run",  # a CI gate inside pytest
    "load_config": "ragbench.experiment.config.run:load_config",
    "load": "ragbench.report.runs:load",  # run folder(s) -> one table with question and run
    "explore": "ragbench.report.explore:explore",  # the per-question view, inline in Jupyter
}

__all__ = [
    "Chunk",
    "Completion",
    "Document",
    "Example",
    "GenerationRequest",
    "Record",
    "ScoredChunk",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'ragbench' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)
