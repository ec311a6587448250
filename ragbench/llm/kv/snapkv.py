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
seen, as for every press: ``kv/press.py``), not at the compressed length.

Per question, by design: the window is the end of each request's prompt, so the kept positions
depend on the question, as in the paper. A compressed document prefix is therefore not shared
between questions; like the other variants, each ``snapkv`` request runs alone and computes its
own prefill (``cached_prompt_tokens`` 0). Compressing with a question-agnostic window (the end
of the document) would be shareable but is a different, weaker method than SnapKV.

Why not NVIDIA's ``kvpress``, which implements SnapKV as a "press": kvpress 0.5.5 requires
``transformers<5.3`` and this project runs transformers 5.x (5.24 when this was written), so pip
cannot install it beside ours. The method is a press here too (``SnapPress``: its score only;
``kv/press.py`` owns the cache layer and the forward hook on each attention module that hands
the score the layer's input hidden states and rotary embeddings: the window's queries are
recomputed from them with the layer's own ``q_proj``: Llama-style attention, e.g. SmolLM2,
Llama, Qwen2/3, Mistral).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ragbench.llm.kv.press import Press, Seen, press_cache

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache, PreTrainedModel

DEFAULT_RATIO = 0.5  # fraction of the positions before the window kept
DEFAULT_WINDOW = 32  # observation window: the last prompt positions, which hold the question
POOL_KERNEL = 5  # average-pool kernel over the scores (the official SnapKV code's default)


def kept(positions: int, ratio: float, window: int) -> int:
    """Positions one KV head keeps of a ``positions``-long prompt: ``ceil(ratio x before the
    window)`` + the window (everything when the prompt is no longer than the window). Pure."""
    before = max(positions - window, 0)
    return min(math.ceil(ratio * before - 1e-9), before) + min(window, positions)


def scores(
    queries: torch.Tensor, keys: torch.Tensor, scaling: float, kernel: int = POOL_KERNEL
) -> torch.Tensor:
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


def window_queries(
    module: Any,
    hidden: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    window: int,
) -> torch.Tensor:
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


@dataclass(frozen=True)
class SnapPress(Press):
    """SnapKV's press: each head keeps the ``ratio`` of the positions before the last ``window``
    that the window's queries attend to most (``scores``), and the whole window."""

    ratio: float
    window: int

    name: ClassVar[str] = "snapkv"

    def kept(self, positions: int) -> int:
        return kept(positions, self.ratio, self.window)

    def score(self, keys: torch.Tensor, values: torch.Tensor, seen: Seen | None) -> torch.Tensor:
        import torch

        assert seen is not None  # compressed from the attention hook, after the prefill
        window = min(self.window, seen.hidden.shape[1])
        queries = window_queries(seen.module, seen.hidden, seen.position_embeddings, window)
        before = scores(queries, keys, seen.module.scaling)
        return torch.nn.functional.pad(before, (0, window), value=float("inf"))  # window kept


def make_snap_cache(
    ratio: float, window: int, model: PreTrainedModel, meta: dict[str, object]
) -> DynamicCache:
    """A press cache (``kv/press.py``) pressed by ``SnapPress``; ``meta`` (the request's
    ``meta["kv_cache"]``) gets the prompt's positions and the positions each head kept once
    the prefill compressed it."""
    cache = press_cache(SnapPress(ratio, window), model, meta)
    meta.update(kv_ratio=ratio, kv_window=window, pool=f"avg{POOL_KERNEL}")
    return cache
