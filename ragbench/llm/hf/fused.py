"""transformers backend: the CPU decode path (``decode: auto`` on the CPU, or ``decode: fused``).

One job: the decode steps after the prefill on the CPU, each decoder layer written out over a
static KV cache (``FusedEngine``), driven by the plain loop's own driver (``Decoder.drive``: the
same token picks, stop checks and dropped rows).

Why: the plain loop's step is transformers' model forward over a ``DynamicCache``. Profiled
(torch.profiler, SmolLM2-135M fp32, 900-token context, AMD EPYC, one thread), beside the linears'
weight read that a step cannot avoid, it spent about as long again in ``aten::cat`` (the cache
grows every layer's keys and values by concatenation: a copy of the whole cache per step, 41 MB
at 900 positions and 180 MB at 4k, into fresh memory) and in transformers' per-step Python
(a mask built per step, module calls and their decorators: ~4,000 aten calls a step). This path:

- copies the prefill's KV once into preallocated per-layer tensors (rows x KV heads x slots x
  head dim; slots: the prompt and ``max_new_tokens``) and writes each step's key and value at its
  slot: no concatenation, the cache never moves;
- runs each layer as the model's code does, op for op and over the model's own modules (norms,
  rotary embedding, activation, and the attention function of its implementation: sdpa, eager,
  or ``shared_prefix``'s), without the model-level forward: the mask is one buffer, sliced (no
  per-step mask building), the attention reads the filled slots only, no module hooks;
- runs the linears through the packed weights where they pay (``cpu_linear.py``: every decode
  call in bf16, whose ``F.linear`` is slow for a few rows, and in fp32 with two or more threads;
  batched rows in fp32 on one).

In float32 the logits are bitwise the plain loop's (tested): the same ops on the same values in
the same order, so the greedy answers are the same. ``torch.compile`` was not used: compiling
the step took minutes on a 2-core machine, once per shape, which a first run would pay.

Supported: Llama-family decoders (``ARCHITECTURES``) whose every layer is full attention
(``shared_prefix.supported``), on the CPU, with the plain KV cache and sdpa or eager attention;
anything else runs the plain loop and ``meta["decode"]["reason"]`` says why.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ragbench.llm import shared_prefix
from ragbench.llm.cpu_linear import GROUPS, Fused, group_of
from ragbench.llm.hf.batch import Batch, Decoded, Stepper
from ragbench.llm.kv import variants as kv_cache
from ragbench.types import GenerationRequest

if TYPE_CHECKING:
    import torch
    from transformers import Cache, PreTrainedModel
    from transformers.cache_utils import DynamicLayer

ARCHITECTURES = ("llama", "mistral", "qwen2")  # one layer code: norm, attention, norm, gated MLP
ATTENTION = ("sdpa", "eager")  # the model's own implementations whose decode mask this builds
REASON_KV = "kv {name}: its own cache layers (the fused path keeps a static cache)"


def model_reason(model: PreTrainedModel, device: torch.device) -> str:
    """Why ``model`` on ``device`` cannot take the fused path ("" when it can)."""
    if getattr(device, "type", str(device)) != "cpu":
        return "the fused step is the CPU path (on CUDA: decode: static)"
    config = model.config
    kind = getattr(config, "model_type", "")
    if kind not in ARCHITECTURES:
        return f"architecture {kind!r}: the fused step is written for {list(ARCHITECTURES)}"
    if not shared_prefix.supported(model):
        return "not every layer is plain full attention"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1 splits the linears"
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ATTENTION:
        return f"attention {impl!r}: the fused step builds masks for {list(ATTENTION)}"
    if getattr(model.get_decoder(), "rotary_emb", None) is None:
        return "no model-level rotary embedding"
    return ""


@dataclass
class FusedDecode:
    """A model's choice of the fused path (``decode``: auto | fused): on, or why not."""

    requested: str = "auto"
    on: bool = False
    reason: str = ""  # why it is off

    @classmethod
    def choose(
        cls, model: PreTrainedModel, device: torch.device, decode: str = "auto"
    ) -> FusedDecode:
        reason = model_reason(model, device)
        return cls(decode, not reason, reason)

    @property
    def path(self) -> str:
        """The decode loop that runs (a part of the calibration key)."""
        return "fused" if self.on else "eager"

    def why_not(self, requests: Sequence[GenerationRequest], kv: kv_cache.KVVariant | None) -> str:
        """Why this call runs the plain loop ("" when it takes the fused path)."""
        if not self.on:
            return self.reason
        if kv is not None and not isinstance(kv, kv_cache.Plain):
            return REASON_KV.format(name=kv.name)
        return ""

    def meta(self, reason: str) -> dict[str, object]:
        return {"path": "eager", "requested": self.requested, "reason": reason}

    @property
    def step_timer(self) -> Callable[..., float] | None:
        """``time_step`` where the fused path is on (the calibration times its decode probes
        with it), else None."""
        return self.time_step if self.on else None

    def time_step(
        self,
        dec: Stepper,
        cache: Cache,
        mask: torch.Tensor,
        positions: torch.Tensor,
        extra: dict,
        tokens: torch.Tensor,
    ) -> float:
        """Seconds of one fused decode step after ``cache`` (a prefill's, or random: the
        calibration's probe), its rows' ``mask`` and last ``positions``."""
        request = GenerationRequest("probe", max_new_tokens=1)
        rows = mask.shape[0]
        batch = Batch([request] * rows, [None] * rows, None, cache, mask, positions, extra, 0.0)
        engine = FusedEngine(dec, batch)
        t0 = dec.now()
        engine.step(tokens)
        return dec.now() - t0

    def run(self, dec: Stepper, batch: Batch) -> Decoded:
        """Decode ``batch`` with the fused step, through the decoder's own loop."""
        engine = FusedEngine(dec, batch)
        decoded = dec.drive(batch, engine)
        decoded.meta = {"path": "fused", "requested": self.requested, "cache_slots": engine.slots}
        return decoded


class FusedEngine:
    """One batch's static cache and its decode step: ``step(tokens)`` returns the next logits,
    ``keep(rows)`` drops the other rows (the plain loop's ``Decoder.drive`` calls both)."""

    def __init__(self, dec: Stepper, batch: Batch) -> None:
        import torch

        model = dec.model
        self.model, self.body = model, model.get_decoder()
        self.rotate = sys.modules[type(model).__module__].apply_rotary_pos_emb
        impl = model.config._attn_implementation  # sdpa, eager, or shared_prefix's (its block)
        self.attend = _attention_function(model, impl)
        self.additive = impl != "sdpa"  # eager-style masks: 0 / dtype min, added to the scores
        self.packed = dec.packed
        self.linear = dec.packed.linear if dec.packed else _plain_linear
        layers = self.body.layers[: model.config.num_hidden_layers]
        self.plan = [_Layer.of(layer, dec.groups) for layer in layers]
        self.head = model.get_output_embeddings()
        self.extra = batch.extra
        rows, self.used = batch.mask.shape
        self.slots = self.used + max(r.max_new_tokens for r in batch.requests)
        self.keys, self.values = _static_cache(batch.cache, self.slots)
        self.filled = self.used  # slots holding a position; the next step writes slot ``filled``
        self.dtype = self.keys[0].dtype if self.keys else torch.float32
        self.allow = torch.ones((rows, self.slots), dtype=torch.bool, device=batch.mask.device)
        self.allow[:, : self.used] = batch.mask.bool()
        self._masks()
        self.positions = batch.positions[:, -1:]  # each step: the next position

    def _masks(self) -> None:
        """The mask buffers a step slices: sdpa's boolean (None without padding, as
        transformers passes it) or the additive one, over every slot."""
        import torch

        self.padded = not bool(self.allow[:, : self.used].all())
        zero = torch.tensor(0.0, dtype=self.dtype, device=self.allow.device)
        self.mask_buffer = (
            torch.where(self.allow, zero, torch.finfo(self.dtype).min)[:, None, None, :]
            if self.additive
            else self.allow[:, None, None, :]
        )

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (in this order) decode on: their cache, mask and positions."""
        import torch

        index = torch.tensor(rows, device=self.allow.device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.allow, self.positions = self.allow[index], self.positions[index]
        self._masks()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step of every row: ``tokens`` (rows,) in, the next logits (rows, vocab)."""
        n = self.filled + 1  # positions the step attends to, its own included
        self.positions = self.positions + 1
        hidden = self.body.embed_tokens(tokens[:, None])
        rope = self.body.rotary_emb(hidden, self.positions)
        mask = self.mask_buffer[..., :n] if self.additive or self.padded else None
        for i, layer in enumerate(self.plan):
            hidden = self._layer(i, layer, hidden, rope, mask)
        self.filled = n
        hidden = self.body.norm(hidden)
        return self.linear(self.head, hidden[:, -1, :])

    def _layer(
        self, i: int, layer: _Layer, hidden: torch.Tensor, rope: tuple, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One decoder layer, as ``LlamaDecoderLayer.forward`` computes it, its key and value
        written at slot ``filled`` of layer ``i``'s cache."""
        attn, n = layer.attn, self.filled + 1
        shape = (hidden.shape[0], 1, -1, attn.head_dim)
        q, k, v = self._group(layer.qkv, layer.norm_in(hidden))
        q, k = self.rotate(q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), *rope)
        keys, values = self.keys[i], self.values[i]
        keys[:, :, self.filled : n].copy_(k)
        values[:, :, self.filled : n].copy_(v.view(shape).transpose(1, 2))
        out, _ = self.attend(
            attn,
            q,
            keys[:, :, :n],
            values[:, :, :n],
            mask,
            dropout=0.0,
            scaling=attn.scaling,
            **self.extra,
        )
        hidden = hidden + self.linear(layer.o, out.reshape(shape[0], 1, -1).contiguous())
        gate, up = self._group(layer.gate_up, layer.norm_post(hidden))
        return hidden + self.linear(layer.down, layer.act(gate) * up)

    def _group(
        self, group: tuple[Fused | None, list[torch.nn.Linear]], x: torch.Tensor
    ) -> Sequence[torch.Tensor]:
        """The outputs of sibling linears on ``x``: one multiply where they are stored side by
        side (``cpu_linear.Fused``) and ``x`` does not take the packed weights, else each its
        own (the same values: tested)."""
        import torch

        fused, modules = group
        if fused is None or (self.packed is not None and self.packed.takes(x, fused.weight)):
            return [self.linear(m, x) for m in modules]
        return torch.nn.functional.linear(x, fused.weight, fused.bias).split(fused.sizes, -1)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's parts, looked up once per batch (not by attribute every step)."""

    attn: Any  # the attention module: its head_dim, scaling, and the attention function's first
    norm_in: Callable[[torch.Tensor], torch.Tensor]  # input_layernorm's forward
    norm_post: Callable[[torch.Tensor], torch.Tensor]  # post_attention_layernorm's forward
    qkv: tuple[Fused | None, list[torch.nn.Linear]]  # (Fused or None, [q_proj, k_proj, v_proj])
    o: torch.nn.Linear
    gate_up: tuple[Fused | None, list[torch.nn.Linear]]  # (Fused or None, [gate_proj, up_proj])
    down: torch.nn.Linear
    act: Callable[[torch.Tensor], torch.Tensor]  # the MLP's activation

    @classmethod
    def of(cls, layer: Any, groups: dict) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = GROUPS
        return cls(
            attn=attn,
            norm_in=layer.input_layernorm.forward,
            norm_post=layer.post_attention_layernorm.forward,
            qkv=(group_of(groups, attn, qkv), [getattr(attn, n) for n in qkv]),
            o=attn.o_proj,
            gate_up=(group_of(groups, mlp, gate_up), [getattr(mlp, n) for n in gate_up]),
            down=mlp.down_proj,
            act=mlp.act_fn,
        )


def _plain_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.nn.functional.linear(x, module.weight, module.bias)


def _attention_function(
    model: PreTrainedModel, impl: str
) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """transformers' attention function of ``impl`` (the one the model's layers call)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = sys.modules[type(model).__module__].eager_attention_forward
    return eager if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]


def _static_cache(cache: Cache, slots: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each layer's prefill keys and values copied into the first positions of ``slots``-long
    tensors; the prefill's own tensors are released as they are copied."""
    keys, values = [], []
    for layer in cast("list[DynamicLayer]", cache.layers):  # the plain cache's (``why_not``)
        k, v = layer.keys, layer.values
        assert k is not None and v is not None  # a prefill's layers hold their positions
        shape = (*k.shape[:2], slots, k.shape[3])
        keys.append(k.new_empty(shape))
        values.append(v.new_empty((*v.shape[:2], slots, v.shape[3])))
        keys[-1][:, :, : k.shape[2]].copy_(k)
        values[-1][:, :, : v.shape[2]].copy_(v)
        layer.keys = layer.values = None
    return keys, values
