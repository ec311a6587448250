"""LLM backends behind one interface (``ragbench.llm.base.LLM``), loaded by name.

The registry maps names to ``"module:Class"`` strings, so importing ``ragbench.llm`` imports no
torch, transformers or httpx; ``load_llm("hf", model="smollm2-135m-instruct")`` imports the
transformers backend only then. Each backend class declares what it can do
(``Capabilities``); ``backend_capabilities(name)`` reads it without building the backend.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any

from ragbench.llm.base import LLM, Capabilities, ContextOverflowError, ServerUnreachable
from ragbench.llm.cache import CachedLLM
from ragbench.registry import Registry

BACKENDS = Registry(
    "LLM backend",
    {
        "hf": "ragbench.llm.hf:HFModel",
        "openai": "ragbench.llm.openai_compat:OpenAICompatLLM",
        "fake": "ragbench.llm.fake:FakeLLM",
    },
)

_LAZY = {
    "FakeLLM": "ragbench.llm.fake:FakeLLM",
    "OpenAICompatLLM": "ragbench.llm.openai_compat:OpenAICompatLLM",
    "LLMRequestError": "ragbench.llm.openai_http:LLMRequestError",
    "HFModel": "ragbench.llm.hf:HFModel",
}

__all__ = [
    "BACKENDS", "LLM", "CachedLLM", "Capabilities", "ContextOverflowError", "ServerUnreachable",
    "backend_capabilities", "load_llm", *_LAZY,
]  # fmt: skip


def load_llm(backend: str, cache: str | os.PathLike | None = None, **kwargs: Any) -> LLM:
    """Build a backend by registry name; ``cache`` wraps it in a sqlite ``CachedLLM``.

    >>> load_llm("fake", context_window=4096).context_window
    4096
    """
    llm = BACKENDS.get(backend)(**kwargs)
    return CachedLLM(llm, cache) if cache is not None else llm


def backend_capabilities(backend: str) -> Capabilities:
    """What the backend registered as ``backend`` can do (its class's ``capabilities``), read
    without building it: importing a backend module loads no torch, transformers or httpx.

    >>> backend_capabilities("fake").default_tokenizer
    'whitespace'
    """
    return BACKENDS.get(backend).capabilities


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'ragbench.llm' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)
