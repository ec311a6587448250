"""StreamingLLM's attention-sink cache layer (Xiao et al. 2023, arXiv:2309.17453), for the
``sinks`` KV-cache variant (``kv_cache.Sinks``).

transformers removed its ``SinkCache`` from the core (it lives on only as a Hub "custom generate"
repository, which needs the network and ``model.generate``), and no maintained package implements
it for this transformers version, so ``SinkLayer`` implements it on the public cache-layer
interface (``DynamicLayer``). Built on first use: this module imports without transformers.
"""

from __future__ import annotations

import functools


@functools.cache
def sink_layer_class() -> type:
    """``SinkLayer``, built on first use: it subclasses transformers' ``DynamicLayer``, and this
    module must import without transformers (strategy parameters validate with it)."""
    from transformers.cache_utils import DynamicLayer

    class SinkLayer(DynamicLayer):
        """StreamingLLM's cache (Xiao et al. 2023): the first ``sinks`` positions ("attention
        sinks", which soak up attention mass however little they matter) and the most recent
        ``window`` positions; the middle is evicted after every forward pass.

        Positions keep the rotary angle they were computed with: the paper re-assigns positions
        inside the cache so a model can stream past its trained length; within the trained
        window the original positions are valid, and this is the same keep-first-and-last
        attention pattern. The mask treats the kept positions as the ones just before the
        current queries (``get_mask_sizes``): every kept key is in the past, so causality holds.

        The decoder prefills in chunks of ``window`` tokens with this cache, so no prompt token
        attends further back than ``sinks + window + chunk`` positions, as in the paper's
        streaming setting; a single full prefill would let the last prompt token see the
        whole document and the eviction would only touch the answer.
        """

        def __init__(self, sinks: int, window: int) -> None:
            super().__init__()
            self.sinks, self.window = sinks, window
            self.cumulative_length = 0  # positions seen so far (the next query's position)

        def update(self, key_states, value_states, *args, **kwargs):
            import torch

            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.cumulative_length += key_states.shape[-2]
            assert self.keys is not None and self.values is not None  # initialised above
            keys = torch.cat([self.keys, key_states], dim=-2)
            values = torch.cat([self.values, value_states], dim=-2)
            if keys.shape[-2] > self.sinks + self.window:
                s, w = self.sinks, self.window
                self.keys = torch.cat([keys[..., :s, :], keys[..., -w:, :]], dim=-2)
                self.values = torch.cat([values[..., :s, :], values[..., -w:, :]], dim=-2)
            else:
                self.keys, self.values = keys, values
            return keys, values  # this pass attends to everything kept before it + itself

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            stored = self.keys.shape[-2] if self.is_initialized and self.keys is not None else 0
            return stored + query_length, self.cumulative_length - stored

        def get_seq_length(self) -> int:
            return self.cumulative_length

        def get_max_length(self) -> int:
            return self.sinks + self.window

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("a sink cache has evicted positions: it cannot be cropped")

    return SinkLayer
