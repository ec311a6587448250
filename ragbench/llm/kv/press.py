"""One base for the KV-cache variants that drop positions: a press is a scoring rule over a
cache layer (the pattern of NVIDIA's kvpress, whose ``ScorerPress`` keeps the top-scored
positions and whose presses only define ``score``).

A ``Press`` says how many of a layer's stored positions to keep (``kept``) and how to rank
them (``score``: one number per KV head and position, higher kept); ``PressLayer``, the cache
layer, does the rest: it stores keys and values like transformers' ``DynamicLayer``, keeps
each head's ``kept`` best positions in their original order (``keep_top``), and counts every
position it saw so that new tokens continue at their true positions. A press compresses

- after every forward pass (``every_pass``: StreamingLLM's sinks, ``kv/sinks.py``): from the
  layer's ``update``, which still returns everything for the pass that stored it;
- or once, right after the prefill (SnapKV, ``kv/snapkv.py``): from a forward hook on each
  attention module, which hands the press what the module saw (``Seen``: its input hidden
  states and rotary embeddings), e.g. to recompute the last positions' queries.

Kept keys keep the rotary angle of their true position. The mask treats the kept positions as
the ones just before the current queries (``get_mask_sizes``): every kept key is in the past,
so causality holds. A new press is one small class: its parameters, ``kept`` and ``score``.

kvpress itself cannot be installed beside this project's transformers (``kv/snapkv.py`` says
why); the layer is written on transformers' public cache-layer interface and is built on first
use, so this module imports without transformers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache, PreTrainedModel

_HOOKED = "_ragbench_press_hooks"  # model attribute: the hooks are installed


@dataclass(frozen=True)
class Seen:
    """What an attention module saw in the pass that ended the prefill: the module (its
    ``q_proj``, ``head_dim``, ``scaling``), its input ``hidden`` states ``(batch, positions,
    hidden)`` and its rotary ``position_embeddings`` ``(cos, sin)``."""

    module: Any  # read by attribute (q_proj, head_dim, scaling): torch's Module types none
    hidden: torch.Tensor
    position_embeddings: tuple[torch.Tensor, torch.Tensor]


class Press:
    """A scoring rule over one cache layer's positions. Subclasses define ``kept`` and
    ``score``; the layer keeps each KV head's ``kept(positions)`` best-scored positions."""

    name: ClassVar[str] = ""  # the variant's name, for messages
    every_pass: ClassVar[bool] = False  # compress after every pass (else once, after the prefill)

    def kept(self, positions: int) -> int:
        """How many of ``positions`` stored positions each head keeps (all: nothing is scored)."""
        raise NotImplementedError

    def score(self, keys: torch.Tensor, values: torch.Tensor, seen: Seen | None) -> torch.Tensor:
        """``(batch, kv_heads, positions)``, higher kept, for the stored ``keys`` and ``values``
        ``(batch, kv_heads, positions, head_dim)``; ``seen`` is None for an ``every_pass``
        press. Positions that must stay get scores above every other (e.g. ``inf``)."""
        raise NotImplementedError

    def max_positions(self) -> int:
        """The most positions the layer ever holds (-1: no bound, as ``DynamicLayer``)."""
        return -1


def keep_top(
    keys: torch.Tensor, values: torch.Tensor, score: torch.Tensor, keep: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's ``keep`` best-scored positions of ``keys`` and ``values``, in their order."""
    index = score.topk(keep, dim=-1).indices.sort(dim=-1).values  # (batch, kv_heads, keep)
    index = index[..., None].expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, index), values.gather(2, index)


@functools.cache
def press_layer_class() -> type[Any]:  # a DynamicLayer subclass, made on first use
    """``PressLayer``, built on first use (it subclasses transformers' ``DynamicLayer``, and this
    module must import without transformers: strategy parameters validate with it)."""
    from transformers.cache_utils import DynamicLayer

    class PressLayer(DynamicLayer):
        """A ``DynamicLayer`` that a ``Press`` compresses; ``meta`` (optional) gets the stored
        and kept positions after each compression. Positions are counted, not stored."""

        def __init__(self, press: Press, meta: dict[str, object] | None = None) -> None:
            super().__init__()
            self.press, self.meta = press, meta
            self.cumulative_length = 0  # positions seen so far (the next query's position)
            self.compressed = False  # a press that compresses once has done so

        def update(self, key_states, value_states, *args, **kwargs):
            self.cumulative_length += key_states.shape[-2]
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            if self.press.every_pass:
                self.compress(None)
            return keys, values  # this pass attends to everything kept before it + itself

        def compress(self, seen: Seen | None) -> None:
            assert self.keys is not None and self.values is not None  # after an update stored some
            n = self.keys.shape[-2]
            keep = self.press.kept(n)
            if keep < n:
                score = self.press.score(self.keys, self.values, seen)
                self.keys, self.values = keep_top(self.keys, self.values, score, keep)
            self.compressed = True
            if self.meta is not None:
                self.meta.update(prompt_positions=n, kept_positions=min(keep, n))

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            stored = self.keys.shape[-2] if self.is_initialized and self.keys is not None else 0
            return stored + query_length, self.cumulative_length - stored

        def get_seq_length(self) -> int:
            return self.cumulative_length

        def get_max_length(self) -> int:
            return self.press.max_positions()

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError(
                f"a kv {self.press.name} cache has dropped positions: it cannot be cropped"
            )

    return PressLayer


def press_cache(
    press: Press, model: PreTrainedModel, meta: dict[str, object] | None = None
) -> DynamicCache:
    """A ``DynamicCache`` of ``PressLayer``s pressed by ``press`` (hooks installed on ``model``
    for a press that compresses after the prefill); ``meta`` as ``PressLayer``'s."""
    from transformers import DynamicCache

    if not press.every_pass:
        install_hooks(model, press.name)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    cache = DynamicCache(config=model.config)
    cache.layers = [press_layer_class()(press, meta) for _ in range(layers)]
    return cache


# --------------------------------------------------------------------------- the prefill hook


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's Llama-style attention modules (a ``q_proj`` and a ``layer_idx``)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "q_proj") and hasattr(m, "layer_idx") and hasattr(m, "head_dim")
    ]


def check_attention(model: torch.nn.Module, press: str, name: str = "") -> None:
    """Raise ValueError when a press that reads the attention modules cannot hook this model."""
    if not attention_modules(model):
        kind = getattr(model.config, "model_type", "?")
        raise ValueError(
            f"kv {press} needs Llama-style attention modules (q_proj, layer_idx); "
            f"{name or kind} ({kind}) has none: use plain, offloaded, sinks or quantized"
        )


def _hook(module: Any, args: tuple, kwargs: dict, output: object) -> None:
    """After an attention module's forward: compress its layer of a press cache once, at the
    end of the prefill (the pass that saw more than one position)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    layers = getattr(cache, "layers", None)
    if not layers or module.layer_idx >= len(layers):
        return
    layer = layers[module.layer_idx]
    if not isinstance(layer, press_layer_class()) or layer.press.every_pass or layer.compressed:
        return
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if hidden is None or hidden.shape[1] < 2:
        return
    layer.compress(Seen(module, hidden, kwargs["position_embeddings"]))


def install_hooks(model: torch.nn.Module, press: str = "") -> None:
    """Forward hooks on every attention module, once per model. They act only on a cache made
    of ``PressLayer``s (any other cache returns at the first checks), so they stay installed."""
    if getattr(model, _HOOKED, False):
        return
    check_attention(model, press)
    for m in attention_modules(model):
        m.register_forward_hook(_hook, with_kwargs=True)
    setattr(model, _HOOKED, True)
