"""The LLM interface: batch of GenerationRequest in, list of Completion out.

Template method: the public ``generate`` validates and accounts; a backend implements
``_generate`` only. Backends never truncate a prompt silently: a prompt that does not fit the
window raises ``ContextOverflowError`` and the strategy decides what to do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ragbench.types import Completion, GenerationRequest


class ContextOverflowError(ValueError):
    def __init__(self, prompt_tokens: int, max_new_tokens: int, window: int, model: str):
        super().__init__(
            f"prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens exceeds the "
            f"{window}-token context window of {model}; shorten the context or choose a "
            f"truncation policy (truncate_middle, truncate_head, truncate_tail)"
        )
        self.prompt_tokens, self.max_new_tokens, self.window = prompt_tokens, max_new_tokens, window


class LLM(ABC):
    """Base class of every backend (transformers, OpenAI-compatible HTTP, fake)."""

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

    def identity(self) -> dict[str, Any]:
        """What makes outputs reproducible: backend, model, weights hash or revision.
        Used as part of completion-cache keys and recorded in run manifests."""
        return {"backend": type(self).__name__, "model": self.name}
