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
matmuls (on CPU the prefix part runs torch's fused flash-attention kernel, which returns the
logsumexp the two parts are merged with) because transformers has no implementation of it; it
plugs into transformers through its public ``AttentionInterface`` registry. In float32 it is
exact (same math as full attention, up to float summation order); in bf16/fp16 scores are rounded
like transformers' eager attention, so greedy answers may differ as much as batched vs unbatched
runs do. Queries are processed in chunks so the score block stays bounded.

Without a prefix the same function is grouped-query attention over the rows' own keys, under any
additive mask: the static decode path (``hf/static.py``) runs its steps through it. With an explicit
mask, transformers' SDPA path cannot take the flash kernel: by version it copies every KV head
``group`` times per step (``repeat_kv``) or runs the memory-efficient kernel with one thread block
per row and KV head (no split over the keys), and on an H200 a static step after a 32k prompt took
30.6 ms against 7.8 ms after 1k (benchmarks/results/gpu_check_h200.json, cost part). The two
matmuls here are split over the keys by cuBLAS and read each KV head once.

Supported for models whose every layer is full (global) attention without logit softcapping;
``supported(model)`` says so, and the backend falls back to copying the prefix otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# (queries, prefix keys, prefix values, scale) -> (attention output, its logsumexp)
PrefixOp = Callable[
    ["torch.Tensor", "torch.Tensor", "torch.Tensor", float], tuple["torch.Tensor", "torch.Tensor"]
]

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

    def __getitem__(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._layers[layer_idx]

    def __len__(self) -> int:
        return len(self._layers)


def shared_prefix_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    shared_prefix: SharedPrefix | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` (B, H, q, d) over a shared prefix and the rows' own ``key``/``value``.

    ``shared_prefix[layer_idx]`` is ``(keys, values)`` of shape (1, KVH, P, d), seen by every query;
    ``key``/``value`` (B, KVH, S, d) are the rows' own positions, masked by ``attention_mask``
    (additive, (B, 1, q, S)). Returns (B, q, H, d) like transformers' attention functions.

    Without ``shared_prefix`` it is grouped-query attention over the rows' own keys alone: the
    static decode path's (``hf/static.py``), whose explicit mask would otherwise make transformers'
    SDPA copy every KV head ``group`` times (``repeat_kv``) at every step.
    """
    import torch

    unsupported = [k for k in ("sliding_window", "softcap", "s_aux") if kwargs.get(k) is not None]
    if unsupported:  # supported() should have kept this model on the copying path
        raise NotImplementedError(f"{NAME} attention does not implement {unsupported}")
    prefix = None if shared_prefix is None else shared_prefix[module.layer_idx]
    batch, heads, q_len, dim = query.shape
    kv_heads, suffix_len = key.shape[1], key.shape[2]
    prefix_len = 0 if prefix is None else prefix[0].shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    mask = None if attention_mask is None else attention_mask[:, :, :, :suffix_len]
    fused = _fused_prefix_op(query) if prefix is not None else None
    # score elements per query position (the prefix's only where it is materialised)
    per_query = batch * heads * (suffix_len + (0 if fused else prefix_len))
    step = max(1, SCORE_BLOCK_ELEMENTS // per_query)
    out = torch.empty((batch, q_len, heads, dim), dtype=query.dtype, device=query.device)
    for q0 in range(0, q_len, step):
        q1 = min(q_len, q0 + step)
        n = q1 - q0
        qc = query[:, :, q0:q1].reshape(batch, kv_heads, group * n, dim)
        s_out, s_max, s_sum = _own_part(
            qc, key, value, mask, scale=scale, q_len=q_len, q0=q0, n=n, group=group
        )
        if prefix is None:  # a row with every key masked (-inf) gets zeros, not 0/0
            chunk = s_out.div_(s_sum.clamp_min_(torch.finfo(torch.float32).tiny))
        else:  # prefix part, all rows and heads of a KV group folded together: (KVH, B*g*n, .)
            pk, pv = prefix
            qf = qc.permute(1, 0, 2, 3).reshape(kv_heads, batch * group * n, dim)
            p_out, p_lse = (fused or _prefix_matmul)(qf, pk, pv, scale)
            p_out = p_out.view(kv_heads, batch, group * n, dim).permute(1, 0, 2, 3)
            p_lse = p_lse.view(kv_heads, batch, group * n, 1).permute(1, 0, 2, 3)
            # one softmax over both: weights exp(lse_part - lse_all)
            lse = torch.logaddexp(p_lse, s_max + s_sum.log())
            chunk = p_out.float() * (p_lse - lse).exp_() + s_out * (s_max - lse).exp_()
        out[:, q0:q1] = chunk.to(query.dtype).reshape(batch, heads, n, dim).transpose(1, 2)
    return out, None


def _own_part(
    qc, key, value, mask, *, scale, q_len, q0, n, group
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows' own keys' part of one chunk of queries ``qc`` (B, KVH, g*n, d), the heads of a
    KV group folded into rows (no KV head is copied): unnormalised ``exp(scores - max) @ value``,
    the max and the sum of the weights, in float32. ``q0``: the chunk's first query of
    ``q_len``; ``n``: its queries; ``group``: query heads per KV head."""
    import torch

    batch, kv_heads, suffix_len = key.shape[0], key.shape[1], key.shape[2]
    s_scores = torch.matmul(qc, key.transpose(-1, -2)).float().mul_(scale)
    if mask is not None:
        m = mask[:, :, q0 : q0 + n].float()  # (B, 1, n, S), broadcast over the heads of a group
        s_scores.view(batch, kv_heads, group, n, -1).add_(m[:, :, None])
    elif suffix_len > 1 or n > 1:  # no mask given: plain causal over the row's own keys
        offset = suffix_len - q_len + q0
        i = torch.arange(n, device=qc.device)[:, None] + offset
        j = torch.arange(suffix_len, device=qc.device)[None, :]
        s_scores.masked_fill_((j > i).repeat(group, 1), float("-inf"))
    s_max = s_scores.amax(-1, keepdim=True)
    s_max = torch.where(torch.isfinite(s_max), s_max, 0.0)  # rows with every key masked
    s_exp = s_scores.sub_(s_max).exp_()
    s_sum = s_exp.sum(-1, keepdim=True)
    s_out = torch.matmul(s_exp.to(value.dtype), value).float()
    return s_out, s_max, s_sum


def _prefix_matmul(
    qf: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``qf`` (KVH, M, d) over the prefix (1, KVH, P, d): (output, logsumexp)."""
    import torch

    scores = torch.matmul(qf, pk[0].transpose(-1, -2)).float().mul_(scale)
    top = scores.amax(-1, keepdim=True)
    weights = scores.sub_(top).exp_()
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights.to(pv.dtype), pv[0]).float().div_(total)
    return out, top + total.log()


def _fused_prefix_op(query: torch.Tensor) -> PrefixOp | None:
    """On CPU, torch's fused flash-attention kernel, which also returns the logsumexp (no score
    matrix in memory, one pass): several times faster than the matmuls above for a batch of
    decode steps over a long prefix. None elsewhere (the matmul path)."""
    import torch

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if query.device.type != "cpu" or op is None:
        return None

    def prefix(
        qf: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        parts = sequence_parts(torch.get_num_threads(), pk, qf.shape[1], pv)
        if parts == 1:
            out, lse = op(qf[None], pk, pv, scale=scale)
            return out[0], lse[0, :, :, None]
        # the prefix cut into ``parts`` runs of keys, given to the kernel as a batch (views, no
        # copy), each attended by all queries; the runs are merged by their logsumexps
        _, kv_heads, length, dim = pk.shape
        run = length // parts
        shape = (parts, kv_heads, run, dim)

        def runs(t: torch.Tensor) -> torch.Tensor:  # (1, KVH, P, d) -> (parts, KVH, run, d), a view
            return t.as_strided(shape, (run * dim, t.stride(1), dim, 1))

        q = qf[None].expand(parts, -1, -1, -1)
        out, lse = op(q, runs(pk), runs(pv), scale=scale)
        if parts * run < length:  # the few keys left over
            t_out, t_lse = op(
                qf[None], pk[:, :, parts * run :], pv[:, :, parts * run :], scale=scale
            )
            out, lse = torch.cat([out, t_out]), torch.cat([lse, t_lse])
        total = torch.logsumexp(lse, 0)
        merged = (out * (lse - total).exp_()[..., None]).sum(0)
        return merged, total[..., None]

    return prefix


MIN_RUN_KEYS = 512  # keys per run, at least, when a prefix is cut for the threads


def sequence_parts(
    threads: int, pk: torch.Tensor, queries: int, pv: torch.Tensor | None = None
) -> int:
    """Runs to cut a prefix's keys into so the kernel's work divides evenly among ``threads``.

    The CPU kernel shares out (batch x KV heads x query blocks); a decode step's few queries make
    one block per head, so 3 KV heads on 2 threads leave one thread idle a third of the time
    (measured 1.21 ms a layer against 1.00 cut in 2 runs, SmolLM2 over 4k keys, 2 threads). One
    run where the queries fill blocks (> 128), the threads divide the heads already, or the keys
    are few or not laid out as (positions, dim) rows (the views need that)."""
    import math

    kv_heads, length = pk.shape[1], pk.shape[2]
    parts = min(8, threads // math.gcd(threads, kv_heads))
    if parts == 1 or queries > 128 or length // parts < MIN_RUN_KEYS:
        return 1
    if any(t.stride(3) != 1 or t.stride(2) != t.shape[3] for t in (pk, pv) if t is not None):
        return 1
    return parts
