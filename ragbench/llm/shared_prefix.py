"""Shared-prefix ("cascade") attention: many questions attend to one stored document KV cache.

Batched decoding after a shared prefix normally gives every row its own copy of the prefix KV
(``batch_repeat_interleave``), and each decode step then re-reads, re-expands (GQA head repeat)
and re-concatenates that copy: B questions on a 4k-token document move B x 4k positions of KV per
layer per token, so batching stops paying off. Here the prefix KV is kept once (batch of one,
read-only) and the per-row cache holds only the question and the answer. Each layer's attention
is computed in two parts with one softmax across both:

- prefix: the queries of all rows (and all query heads of a KV group) are folded into one matrix
  and multiplied by the single prefix K/V, so the prefix is read once per step for the batch;
- suffix: the usual masked attention over the row's own keys (left padding, causal).

This is the cascade/shared-prefix attention of FlashInfer and vLLM, written here in plain torch
matmuls because transformers has no implementation of it; it plugs into transformers through
its public ``AttentionInterface`` registry. In float32 it is exact (same math as full attention,
up to float summation order); in bf16/fp16 scores are rounded like transformers' eager attention,
so greedy answers may differ as much as batched vs unbatched runs do. Queries are processed in
chunks so the score block stays bounded.

Supported for models whose every layer is full (global) attention without logit softcapping;
``supported(model)`` says so, and the backend falls back to copying the prefix otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NAME = "ragbench_shared_prefix"
SCORE_BLOCK_ELEMENTS = 1 << 25  # ~128 MB of float32 scores per chunk of queries


def supported(model: Any) -> bool:
    """Whether ``model`` routes attention through transformers' ``AttentionInterface`` and every
    layer is plain full attention (what this module implements). Composite models (vision or
    audio towers with their own sub-configs) are left to the copying path."""
    if not getattr(model, "_supports_attention_backend", False):
        return False
    config = model.config
    if getattr(config, "sub_configs", None):
        return False
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    sliding = getattr(config, "sliding_window", None)
    if sliding and getattr(config, "use_sliding_window", True) and types is None:
        return False
    if getattr(config, "attn_logit_softcapping", None):
        return False
    return getattr(config, "model_type", "") not in ("gemma2", "gemma3", "gemma3_text")


def register() -> None:
    """Register the attention function and its (eager, additive) mask with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, shared_prefix_attention)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:  # without it the model would pass no padding mask
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)


@contextlib.contextmanager
def active(model: Any) -> Iterator[None]:
    """Route ``model``'s attention through ``shared_prefix_attention`` inside the block."""
    register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous


class SharedPrefix:
    """Per-layer ``(keys, values)`` of a batch-of-one prefix cache, passed to every layer.

    Deliberately not a list, tuple or mapping and without ``.to``: accelerate's device hooks
    (``device_map="auto"``) would otherwise copy every layer's prefix to each layer's GPU at every
    step. Each layer reads only its own entry, which already lives on that layer's device.
    """

    def __init__(self, cache: Any) -> None:
        self._layers = [(layer.keys, layer.values) for layer in cache.layers]

    def __getitem__(self, layer_idx: int) -> tuple[Any, Any]:
        return self._layers[layer_idx]

    def __len__(self) -> int:
        return len(self._layers)


def shared_prefix_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    shared_prefix: SharedPrefix | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention of ``query`` (B, H, q, d) over a shared prefix and the rows' own ``key``/``value``.

    ``shared_prefix[layer_idx]`` is ``(keys, values)`` of shape (1, KVH, P, d), seen by every query;
    ``key``/``value`` (B, KVH, S, d) are the rows' own positions, masked by ``attention_mask``
    (additive, (B, 1, q, S)). Returns (B, q, H, d) like transformers' attention functions.
    """
    import torch

    if shared_prefix is None:
        raise ValueError(f"{NAME} attention needs shared_prefix=SharedPrefix(prefix cache)")
    unsupported = [k for k in ("sliding_window", "softcap", "s_aux") if kwargs.get(k) is not None]
    if unsupported:  # supported() should have kept this model on the copying path
        raise NotImplementedError(f"{NAME} attention does not implement {unsupported}")
    pk, pv = shared_prefix[module.layer_idx]
    batch, heads, q_len, dim = query.shape
    kv_heads, prefix_len, suffix_len = key.shape[1], pk.shape[2], key.shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    mask = None if attention_mask is None else attention_mask[:, :, :, :suffix_len]
    per_query = batch * heads * (prefix_len + suffix_len)  # score elements per query position
    step = max(1, SCORE_BLOCK_ELEMENTS // per_query)
    out = torch.empty((batch, q_len, heads, dim), dtype=query.dtype, device=query.device)
    for q0 in range(0, q_len, step):
        q1 = min(q_len, q0 + step)
        n = q1 - q0
        qc = query[:, :, q0:q1].reshape(batch, kv_heads, group * n, dim)
        # suffix part, per row: (B, KVH, g*n, S)
        s_scores = torch.matmul(qc, key.transpose(-1, -2)).float() * scale
        if mask is not None:
            m = mask[:, :, q0:q1].float()  # (B, 1, n, S), broadcast over the heads of a group
            s_scores = (s_scores.view(batch, kv_heads, group, n, -1) + m[:, :, None]).view_as(
                s_scores
            )
        elif suffix_len > 1 or n > 1:  # no mask given: plain causal over the row's own keys
            offset = suffix_len - q_len + q0
            i = torch.arange(n, device=query.device)[:, None] + offset
            j = torch.arange(suffix_len, device=query.device)[None, :]
            blocked = (j > i).repeat(group, 1)
            s_scores = s_scores.masked_fill(blocked, float("-inf"))
        # prefix part, all rows and heads of a KV group folded together: (KVH, B*g*n, P)
        qf = qc.permute(1, 0, 2, 3).reshape(kv_heads, batch * group * n, dim)
        p_scores = torch.matmul(qf, pk[0].transpose(-1, -2)).float() * scale
        p_max = p_scores.amax(-1, keepdim=True)  # (KVH, B*g*n, 1)
        s_max = s_scores.amax(-1, keepdim=True)  # (B, KVH, g*n, 1)
        top = torch.maximum(p_max.view(kv_heads, batch, group * n, 1).permute(1, 0, 2, 3), s_max)
        top_f = top.permute(1, 0, 2, 3).reshape(kv_heads, batch * group * n, 1)
        p_exp = torch.exp(p_scores - top_f)
        s_exp = torch.exp(s_scores - top)
        denom = p_exp.sum(-1, keepdim=True).view(kv_heads, batch, group * n, 1).permute(1, 0, 2, 3)
        denom = denom + s_exp.sum(-1, keepdim=True)
        p_out = torch.matmul(p_exp.to(pv.dtype), pv[0])  # (KVH, B*g*n, d)
        p_out = p_out.view(kv_heads, batch, group * n, dim).permute(1, 0, 2, 3)
        s_out = torch.matmul(s_exp.to(value.dtype), value)  # (B, KVH, g*n, d)
        chunk = ((p_out.float() + s_out.float()) / denom).to(query.dtype)
        out[:, q0:q1] = chunk.reshape(batch, heads, n, dim).transpose(1, 2)
    return out, None
