"""SnapKV: compress a prompt's KV cache to the positions its question attends to.

SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation",
arXiv:2404.14469) observes that the attention the last positions of a prompt (the
"observation window", which holds the question) give the earlier positions predicts which of
them generation will read. After the prompt's prefill, for every layer and KV head:

1. the window's queries (the last ``window`` prompt positions, RoPE applied) attend to every
   prompt key, causally, softmax over the row;
2. each earlier position's score is the attention the window's queries give it, summed over
   the window (under grouped-query attention, averaged over the query heads that share the KV
   head: the heads of a group must keep the same positions);
3. the scores are smoothed with a 1-D average pool (kernel ``POOL_KERNEL``, the official code's
   default), so a kept position brings its neighbours and a fact is not cut mid-phrase;
4. the top ``ceil(ratio x positions before the window)`` positions per head are kept, in their
   original order, plus the whole window; the rest is dropped. Each head keeps its own
   positions but as many as the others, so the cache stays one rectangular tensor per layer.

The prefill itself attends to the whole prompt (the first token is computed exactly); only the
decode steps read the compressed cache. Kept keys keep the rotary angle of their true position,
and new tokens continue at the full prompt length (``get_seq_length`` counts every position
seen, as ``kv_cache.SinkLayer`` does), not at the compressed length.

Per question, by design: the window is the end of each request's prompt, so the kept positions
depend on the question, as in the paper. A compressed document prefix is therefore not shared
between questions; like the other variants, each ``snapkv`` request runs alone and computes its
own prefill (``cached_prompt_tokens`` 0). Compressing with a question-agnostic window (the end
of the document) would be shareable but is a different, weaker method than SnapKV.

Why not NVIDIA's ``kvpress``, which implements SnapKV as a "press": kvpress 0.5.5 requires
``transformers<5.3`` and this project runs transformers 5.x (5.24 when this was written), so pip
cannot install it beside ours. The one method is implemented here on transformers' public
cache-layer interface (``DynamicLayer``) plus a forward hook on each attention module that sees
the layer's input hidden states and rotary embeddings (the window's queries are recomputed from
them with the layer's own ``q_proj``: Llama-style attention, e.g. SmolLM2, Llama, Qwen2/3, Mistral).
"""

from __future__ import annotations

import functools
import math
from typing import Any

DEFAULT_RATIO = 0.5  # fraction of the positions before the window kept
DEFAULT_WINDOW = 32  # observation window: the last prompt positions, which hold the question
POOL_KERNEL = 5  # average-pool kernel over the scores (the official SnapKV code's default)
_HOOKED = "_ragbench_snapkv_hooks"  # model attribute: the hooks are installed


def check(ratio: Any, window: Any) -> None:
    """Raise ValueError for a ratio outside (0, 1] or a window below 1. Pure."""
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
        raise ValueError(
            f"kv snapkv needs ratio in (0, 1] (the fraction of the prefix kept, "
            f"e.g. 0.5), got {ratio!r}"
        )
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"kv snapkv needs window >= 1, got {window!r}")


def kept(positions: int, ratio: float, window: int) -> int:
    """Positions one KV head keeps of a ``positions``-long prompt: ``ceil(ratio x before the
    window)`` + the window (everything when the prompt is no longer than the window). Pure."""
    before = max(positions - window, 0)
    return min(math.ceil(ratio * before - 1e-9), before) + min(window, positions)


def scores(queries: Any, keys: Any, scaling: float, kernel: int = POOL_KERNEL) -> Any:
    """SnapKV's scores of the positions before the window, ``(batch, kv_heads, positions -
    window)``: the window's ``queries`` ``(batch, heads, window, head_dim)`` (RoPE applied)
    against every prompt key ``(batch, kv_heads, positions, head_dim)``, causal softmax,
    summed over the window, averaged over each KV head's query group, average-pooled."""
    import torch

    b, heads, w, d = queries.shape
    kv_heads, n = keys.shape[1], keys.shape[2]
    groups = heads // kv_heads
    # query head h reads KV head h // groups (transformers' repeat_kv): group the queries
    q = queries.float().reshape(b, kv_heads, groups * w, d)
    logits = (q @ keys.float().transpose(-1, -2) * scaling).view(b, kv_heads, groups, w, n)
    # window query i sits at position n - w + i and sees keys up to it
    future = (
        torch.arange(n, device=keys.device)[None, :]
        > torch.arange(n - w, n, device=keys.device)[:, None]
    )
    attn = logits.masked_fill(future, float("-inf")).softmax(-1)
    summed = attn[..., : n - w].sum(-2).mean(2)  # over the window, then over the group
    return torch.nn.functional.avg_pool1d(summed, kernel, stride=1, padding=kernel // 2)


def compress(keys: Any, values: Any, score: Any, keep: int) -> tuple[Any, Any]:
    """Keep each head's ``keep`` best-scored positions before the window (in their order) and
    the whole window; ``score`` covers the positions before the window."""
    before = score.shape[-1]
    index = score.topk(keep, dim=-1).indices.sort(dim=-1).values  # (batch, kv_heads, keep)
    index = index[..., None].expand(-1, -1, -1, keys.shape[-1])
    return (
        torch_cat(keys[..., :before, :].gather(2, index), keys[..., before:, :]),
        torch_cat(values[..., :before, :].gather(2, index), values[..., before:, :]),
    )


def torch_cat(a: Any, b: Any) -> Any:
    import torch

    return torch.cat([a, b], dim=-2)


def attention_modules(model: Any) -> list[Any]:
    """The model's Llama-style attention modules (a ``q_proj`` and a ``layer_idx``)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "q_proj") and hasattr(m, "layer_idx") and hasattr(m, "head_dim")
    ]


def check_model(model: Any, name: str = "") -> None:
    """Raise ValueError when the window's queries cannot be recomputed for this model."""
    if not attention_modules(model):
        kind = getattr(model.config, "model_type", "?")
        raise ValueError(
            f"kv snapkv needs Llama-style attention modules (q_proj, layer_idx); "
            f"{name or kind} ({kind}) has none: use plain, offloaded, sinks or quantized"
        )


def window_queries(module: Any, hidden: Any, position_embeddings: Any, window: int) -> Any:
    """The last ``window`` positions' queries, as the layer computes them: ``q_proj`` (and a
    ``q_norm`` where the architecture has one, e.g. Qwen3), then RoPE."""
    from transformers.models.llama.modeling_llama import rotate_half

    h = hidden[:, -window:]
    q = module.q_proj(h).view(*h.shape[:-1], -1, module.head_dim)
    if getattr(module, "q_norm", None) is not None:
        q = module.q_norm(q)
    q = q.transpose(1, 2)
    cos, sin = position_embeddings
    cos, sin = cos[:, -window:].unsqueeze(1), sin[:, -window:].unsqueeze(1)
    return q * cos + rotate_half(q) * sin


def _hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
    """After an attention module's forward: compress its layer of a SnapKV cache once, at the
    end of the prefill (the pass that saw more than one position)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    layers = getattr(cache, "layers", None)
    if not layers or module.layer_idx >= len(layers):
        return
    layer = layers[module.layer_idx]
    if not isinstance(layer, snap_layer_class()) or layer.compressed:
        return
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if hidden is None or hidden.shape[1] < 2:
        return
    window = min(layer.window, hidden.shape[1])
    queries = window_queries(module, hidden, kwargs["position_embeddings"], window)
    layer.compress(queries, module.scaling)


def install_hooks(model: Any) -> None:
    """Forward hooks on every attention module, once per model. They act only on a cache made
    of ``SnapLayer``s (any other cache returns at the first check), so they stay installed."""
    if getattr(model, _HOOKED, False):
        return
    check_model(model)
    for m in attention_modules(model):
        m.register_forward_hook(_hook, with_kwargs=True)
    setattr(model, _HOOKED, True)


def make_snap_cache(ratio: float, window: int, model: Any, meta: dict[str, Any]) -> Any:
    """A ``DynamicCache`` of ``SnapLayer``s; ``meta`` (the request's ``meta["kv_cache"]``) gets
    the prompt's positions and the positions each head kept once the prefill compressed it."""
    from transformers import DynamicCache

    install_hooks(model)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    cache = DynamicCache(config=model.config)
    cache.layers = [snap_layer_class()(ratio, window, meta) for _ in range(layers)]
    meta.update(kv_ratio=ratio, kv_window=window, pool=f"avg{POOL_KERNEL}")
    return cache


@functools.cache
def snap_layer_class() -> type[Any]:  # a DynamicLayer subclass, made on first use
    """``SnapLayer``, built on first use (it subclasses transformers' ``DynamicLayer``, and this
    module must import without transformers)."""
    from transformers.cache_utils import DynamicLayer

    class SnapLayer(DynamicLayer):
        """A ``DynamicLayer`` whose prompt is compressed once, by ``compress`` (called by the
        attention module's hook right after the prefill). Positions are counted, not stored:
        the mask treats the kept positions as the ones just before the current queries
        (``get_mask_sizes``, as ``SinkLayer``); every kept key is in the past, so causality
        holds, and the rotary angles baked into the keys are their true positions'."""

        def __init__(self, ratio: float, window: int, meta: dict[str, Any]) -> None:
            super().__init__()
            self.ratio, self.window, self.meta = ratio, window, meta
            self.cumulative_length = 0  # positions seen so far (the next query's position)
            self.compressed = False

        def update(self, key_states, value_states, *args, **kwargs):
            self.cumulative_length += key_states.shape[-2]
            return super().update(key_states, value_states, *args, **kwargs)

        def compress(self, queries, scaling: float) -> None:
            assert self.keys is not None  # compressed after the prefill stored the prompt
            n, w = self.keys.shape[-2], queries.shape[-2]
            keep = kept(n, self.ratio, w) - w
            if keep < n - w:  # else: ratio 1 (or a prompt within the window) keeps everything
                score = scores(queries, self.keys, scaling)
                self.keys, self.values = compress(self.keys, self.values, score, keep)
            self.compressed = True
            self.meta.update(prompt_positions=n, kept_positions=keep + w)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            stored = self.keys.shape[-2] if self.is_initialized and self.keys is not None else 0
            return stored + query_length, self.cumulative_length - stored

        def get_seq_length(self) -> int:
            return self.cumulative_length

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("a SnapKV cache has dropped positions: it cannot be cropped")

    return SnapLayer
