"""LLM backends behind one interface (``ragbench.llm.base.LLM``), loaded by name.

The registry maps names to ``"module:Class"`` strings, so importing ``ragbench.llm`` imports no
torch, transformers or httpx; ``load_llm("hf", model="smollm2-135m-instruct")`` imports the
transformers backend only then. Each backend class declares what it can do
(``Capabilities``); ``backend_capabilities(name)`` reads it without building the backend.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping

from ragbench.llm.base import LLM, Capabilities, ContextOverflowError, ServerUnreachable
from ragbench.llm.cache import CachedLLM
from ragbench.registry import Registry, did_you_mean

BACKENDS = Registry(
    "LLM backend",
    {
        "hf": "ragbench.llm.hf.model:HFModel",
        "openai": "ragbench.llm.openai.compat:OpenAICompatLLM",
        "fake": "ragbench.llm.fake:FakeLLM",
    },
)

__all__ = [
    "BACKENDS",
    "LLM",
    "BackendParamError",
    "CachedLLM",
    "Capabilities",
    "ContextOverflowError",
    "ServerUnreachable",
    "backend_capabilities",
    "backend_params",
    "check_backend_params",
    "load_llm",
]


def load_llm(backend: str, cache: str | os.PathLike | None = None, **kwargs: object) -> LLM:
    """Build a backend by registry name; ``cache`` wraps it in a sqlite ``CachedLLM``.

    >>> load_llm("fake", context_window=4096).context_window
    4096
    """
    cls = BACKENDS.get(backend)
    check_backend_params(backend, kwargs)
    llm = cls(**kwargs)
    return CachedLLM(llm, cache) if cache is not None else llm


class BackendParamError(ValueError, TypeError):
    """A parameter the backend does not take: a ``ValueError`` (a user's error: one line from
    the CLI) and the ``TypeError`` the backend's ``__init__`` would have raised."""


def backend_params(backend: str) -> list[str]:
    """The parameters the backend registered as ``backend`` takes (its class's ``__init__``
    keywords), read without building it."""
    sig = inspect.signature(BACKENDS.get(backend).__init__)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in sig.parameters.items() if n != "self" and p.kind in kinds]


def check_backend_params(backend: str, params: Mapping[str, object]) -> None:
    """A ``BackendParamError`` naming the first of ``params`` that the backend does not take (a
    ``base_url`` left set for the fake backend), with the ones it does; a backend whose
    ``__init__`` takes ``**kwargs`` takes anything."""
    sig = inspect.signature(BACKENDS.get(backend).__init__)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = backend_params(backend)
    for key in params:
        if key not in valid:
            raise BackendParamError(
                f"LLM backend {backend!r} takes no parameter {key!r}; {did_you_mean(key, valid)}"
            )


def backend_capabilities(backend: str) -> Capabilities:
    """What the backend registered as ``backend`` can do (its class's ``capabilities``), read
    without building it: importing a backend module loads no torch, transformers or httpx.

    >>> backend_capabilities("fake").default_tokenizer
    'whitespace'
    """
    return BACKENDS.get(backend).capabilities
