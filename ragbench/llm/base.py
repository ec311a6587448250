"""The LLM interface: batch of GenerationRequest in, list of Completion out.

Template method: the public ``generate`` validates and accounts; a backend implements
``_generate`` only. Backends never truncate a prompt silently: a prompt that does not fit the
window raises ``ContextOverflowError`` and the strategy decides what to do.

A batch that fails part-way raises an exception that says what became of each request, so that
callers neither lose the finished ones nor send a request twice (a resend would repeat the
backend's retries): ``exc.partial`` (index -> Completion of the requests that finished) and, where
the backend knows it, ``exc.errors`` (index -> the exception of each request that failed for good).
An exception without ``partial`` says nothing about single requests (a transformers OOM): the
batch driver then runs them one by one to find the culprit.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ragbench.types import Completion, GenerationRequest


def tell_batch(exc: BaseException, **fields: object) -> None:
    """Set what a failed batch's exception (of any type: an interrupt too) says of its requests
    (``partial``, ``errors``, the cache's ``stored``; see the module docstring)."""
    for name, value in fields.items():
        setattr(exc, name, value)


class ContextOverflowError(ValueError):
    def __init__(self, prompt_tokens: int, max_new_tokens: int, window: int, model: str):
        super().__init__(
            f"prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens exceeds the "
            f"{window}-token context window of {model}; shorten the context or choose a "
            f"truncation policy (truncate_middle, truncate_head, truncate_tail)"
        )
        self.prompt_tokens, self.max_new_tokens, self.window = prompt_tokens, max_new_tokens, window


class ServerUnreachable(ValueError):
    """``LLM.check()`` found the model's server unusable: not reachable, not answering, or refusing
    the credentials. One line naming the (redacted) URL and the cause, raised before a run starts
    rather than as one error row per record."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared once on its class (``LLM.capabilities``): callers read a
    capability (``ragbench.llm.backend_capabilities(name)``), never compare backend names. The
    defaults are a backend that can do none of it (a server)."""

    # runs weights in this process: its model name must be a preset, an HF id or a local path,
    # and building it loads them (a dry run counts with the tokenizer alone instead)
    local_weights: bool = False
    # counts tokens with the tokenizer of the model it names (a preset's name also names the
    # tokenizer documents are chunked with)
    own_tokenizer: bool = False
    # keeps a document prefix's KV cache across requests, so its cached prompt tokens follow from
    # the prompts (a dry run estimates them)
    reuses_prefix_kv: bool = False
    # runs GenerationRequest.kv variants (offloaded, sinks, quantized, snapkv)
    kv_variants: bool = False
    # takes rope_scaling / rope_factor: a context window past the trained one
    rescales_rope: bool = False
    # accepts kv_cache variants without running them (``simulate_kv_cache=True``; flagged, tests)
    simulates_kv_cache: bool = False
    # has no architecture of its own: FLOPs and KV bytes need a ``preset`` named for it
    needs_preset: bool = False
    # the tokenizer its token counts follow when none is named (None: the model's own name)
    default_tokenizer: str | None = None

    def replace(self, **changes: Any) -> Capabilities:
        """These capabilities with ``changes`` (a backend's declaration: the base's, plus what
        it can do)."""
        return dataclasses.replace(self, **changes)


class LLM(ABC):
    """Base class of every backend (transformers, OpenAI-compatible HTTP, fake)."""

    capabilities: ClassVar[Capabilities] = Capabilities()  # a backend declares its own
    name: str = "llm"
    context_window: int = 8192

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        requests = list(requests)
        for r in requests:
            if not isinstance(r, GenerationRequest):
                raise TypeError(f"expected GenerationRequest, got {type(r).__name__}")
            n = self.prompt_tokens(r)
            if n + r.max_new_tokens > self.context_window:
                raise ContextOverflowError(n, r.max_new_tokens, self.context_window, self.name)
        if not requests:
            return []
        out = self._generate(requests)
        if len(out) != len(requests):
            raise RuntimeError(
                f"{type(self).__name__} returned {len(out)} completions for {len(requests)} requests"
            )
        return out

    @abstractmethod
    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]: ...

    @abstractmethod
    def count_tokens(self, text: str) -> int: ...

    def prompt_tokens(self, request: GenerationRequest) -> int:
        """Tokens the request occupies in the window, template included where the backend knows it."""
        return self.count_tokens(request.system + request.prompt)

    def check(self) -> None:  # noqa: B027 (an optional hook: most backends need no check)
        """Raise ``ServerUnreachable`` if the backend cannot serve requests, cheaply (short
        requests shaped as the run's, no retries). A local model has nothing to check: the
        default does nothing."""

    def identity(self) -> dict[str, object]:
        """What makes outputs reproducible: backend, model, weights hash or revision.
        Used as part of completion-cache keys and recorded in run manifests."""
        return {"backend": type(self).__name__, "model": self.name}
