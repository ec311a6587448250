"""StreamingLLM's attention sinks (Xiao et al. 2023, arXiv:2309.17453) as a press
(``kv/press.py``), for the ``sinks`` KV-cache variant (``kv_cache.Sinks``).

transformers removed its ``SinkCache`` from the core (it lives on only as a Hub "custom generate"
repository, which needs the network and ``model.generate``), and no maintained package implements
it for this transformers version, so it is implemented here: the first ``sinks`` positions
("attention sinks", which soak up attention mass however little they matter) and the most
recent ``window`` positions are kept; the middle is evicted after every forward pass.

Positions keep the rotary angle they were computed with: the paper re-assigns positions inside
the cache so a model can stream past its trained length; within the trained window the original
positions are valid, and this is the same keep-first-and-last attention pattern.

The decoder prefills in chunks of ``window`` tokens with this cache, so no prompt token attends
further back than ``sinks + window + chunk`` positions, as in the paper's streaming setting; a
single full prefill would let the last prompt token see the whole document and the eviction
would only touch the answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ragbench.llm.kv.press import Press, Seen, press_layer_class

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SinkPress(Press):
    """Keep the first ``sinks`` and the last ``window`` positions: the score is recency, with
    the sinks above every other position."""

    sinks: int
    window: int

    name: ClassVar[str] = "sinks"
    every_pass: ClassVar[bool] = True

    def kept(self, positions: int) -> int:
        return min(positions, self.sinks + self.window)

    def score(self, keys: torch.Tensor, values: torch.Tensor, seen: Seen | None) -> torch.Tensor:
        import torch

        n = keys.shape[-2]
        position = torch.arange(n, device=keys.device)
        return (position + n * (position < self.sinks)).expand(*keys.shape[:-1])

    def max_positions(self) -> int:
        return self.sinks + self.window


@functools.cache
def sink_layer_class() -> type[Any]:
    """``SinkLayer(sinks, window)``: one cache layer kept StreamingLLM's way (a ``PressLayer``
    pressed by ``SinkPress``), built on first use like the base."""

    class SinkLayer(press_layer_class()):  # type: ignore[misc]  # a class made at run time
        def __init__(self, sinks: int, window: int) -> None:
            super().__init__(SinkPress(sinks, window))

    return SinkLayer
