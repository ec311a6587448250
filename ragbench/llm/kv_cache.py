"""KV-cache variants for the transformers backend, and the cache's measured size in bytes.

A long-context query's memory is dominated by its KV cache (``cost.kv_cache_bytes``); the
techniques that make long context affordable change how that cache is kept. Each is one
``kv_cache`` choice of a ``GenerationRequest`` (and of the ``long_context`` strategy's parameters):

- ``plain``: transformers' ``DynamicCache``, in the model's dtype. The reference.
- ``offloaded``: ``DynamicCache(offloading=True)``: every layer's KV goes back to host memory
  after its use and is prefetched for the next layer (tiered KV). It only means something on an
  accelerator; on a CPU the cache already lives in host memory, so there it is a recorded no-op
  (``meta["kv_cache"]["note"]``) that runs the plain cache, never a pretend saving.
- ``sinks``: sliding window with attention sinks (StreamingLLM, Xiao et al. 2023,
  arXiv:2309.17453): keep the first ``sink_tokens`` and the last ``window_tokens`` positions and
  evict the middle. transformers removed its ``SinkCache`` from the core (it lives on only as a
  Hub "custom generate" repository, which needs the network and ``model.generate``), and no
  maintained package implements it for this transformers version, so ``SinkLayer`` below
  implements it on the public cache-layer interface (``sink_layer_class``).
- ``quantized``: transformers' ``QuantizedCache`` (KIVI-style, Liu et al. 2024,
  arXiv:2402.02750): keys and values quantized per channel in groups, with a short residual of
  recent positions kept in full precision. Backends: ``hqq`` (1, 2, 3, 4 or 8 bits) and ``quanto``
  (``optimum-quanto``: 2 or 4 bits in this transformers version); ``pip install 'ragbench[kvquant]'``.
- ``snapkv``: SnapKV (Li et al. 2024, arXiv:2404.14469; ``kv_compress.py``, which says why not
  kvpress): after the prefill, each KV head keeps the ``kv_ratio`` of the positions before the
  last ``kv_window`` prompt positions that the window (the question) attends to most, plus the
  window. Per question: the kept positions depend on the question, so no prefix is shared.

Measured bytes (``cache_bytes``) are the tensors the cache object holds, in their real dtype:
packed integer codes, scales and zero points of a quantized cache included. For the plain cache
this equals the formula ``2 x layers x kv_heads x head_dim x positions x bytes`` exactly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ragbench.registry import unknown

KV_CACHES = ("plain", "offloaded", "sinks", "quantized", "snapkv")
# bits each quantization backend accepts with transformers 5.x (its QuantizedLayer checks)
QUANT_BACKENDS: dict[str, tuple[int, ...]] = {"hqq": (1, 2, 3, 4, 8), "quanto": (2, 4)}
QUANT_PACKAGES = {"hqq": "hqq", "quanto": "optimum-quanto"}
DEFAULT_SINK_TOKENS = 4  # StreamingLLM's choice: 4 initial tokens suffice as attention sinks
DEFAULT_WINDOW_TOKENS = 1024
QUANT_GROUP_SIZE = 64  # values per quantization group (transformers' default)


@dataclass(frozen=True)
class KVSpec:
    """How one request's KV cache is kept (``GenerationRequest`` fields, validated here)."""

    kind: str = "plain"  # plain | offloaded | sinks | quantized | snapkv
    bits: int | None = None  # quantized: bits per value
    backend: str | None = None  # quantized: hqq | quanto
    sink_tokens: int | None = None  # sinks: first positions always kept
    window_tokens: int | None = None  # sinks: last positions kept
    ratio: float | None = None  # snapkv: fraction of the positions before the window kept
    window: int | None = None  # snapkv: observation window (last prompt positions, kept)

    def __post_init__(self) -> None:
        check(
            self.kind,
            self.bits,
            self.backend,
            self.sink_tokens,
            self.window_tokens,
            self.ratio,
            self.window,
        )

    @classmethod
    def of(cls, request: Any) -> KVSpec:
        return cls(
            request.kv_cache,
            request.kv_bits,
            request.kv_backend,
            request.sink_tokens,
            request.window_tokens,
            request.kv_ratio,
            request.kv_window,
        )

    def label(self) -> str:
        """``plain``, ``offloaded``, ``sinks-4+1024``, ``quantized-hqq-int8``, ``snapkv-0.5-w32``:
        the benchmark names."""
        if self.kind == "snapkv":
            return f"snapkv-{self.ratio:g}-w{self.window}"
        if self.kind == "sinks":
            return f"sinks-{self.sink_tokens}+{self.window_tokens}"
        if self.kind == "quantized":
            return f"quantized-{self.backend}-int{self.bits}"
        return self.kind


def check(
    kind: str,
    bits: int | None = None,
    backend: str | None = None,
    sink_tokens: int | None = None,
    window_tokens: int | None = None,
    ratio: float | None = None,
    window: int | None = None,
) -> None:
    """Raise ValueError naming the valid choices for an inconsistent KV-cache choice. Pure:
    strategy parameters and requests both call it."""
    from ragbench.llm import kv_compress

    if kind not in KV_CACHES:
        raise unknown("kv_cache", str(kind), KV_CACHES)
    if kind == "quantized":
        if backend not in QUANT_BACKENDS:
            raise unknown("kv_cache=quantized backend", str(backend), list(QUANT_BACKENDS))
        if bits not in QUANT_BACKENDS[backend]:
            raise ValueError(
                f"kv_cache=quantized backend {backend!r} supports kv_bits "
                f"{list(QUANT_BACKENDS[backend])}, got {bits!r}"
            )
    elif bits is not None or backend is not None:
        raise ValueError(f"kv_bits and kv_backend apply to kv_cache=quantized only, not {kind!r}")
    if kind == "sinks":
        for name, v in (("sink_tokens", sink_tokens), ("window_tokens", window_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"kv_cache=sinks needs {name} >= 1, got {v!r}")
    elif sink_tokens is not None or window_tokens is not None:
        raise ValueError(
            f"sink_tokens and window_tokens apply to kv_cache=sinks only, not {kind!r}"
        )
    if kind == "snapkv":
        kv_compress.check(ratio, window)
    elif ratio is not None or window is not None:
        raise ValueError(f"kv_ratio and kv_window apply to kv_cache=snapkv only, not {kind!r}")


def check_backend_installed(backend: str) -> None:
    """A clear ImportError naming the missing package (and the extra that installs it)."""
    import importlib.util

    module = {"hqq": "hqq", "quanto": "optimum.quanto"}[backend]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # "optimum" itself missing
        found = False
    if not found:
        raise ImportError(
            f"kv_cache=quantized with backend {backend!r} needs the {QUANT_PACKAGES[backend]!r} "
            f"package: pip install 'ragbench[kvquant]' (or pip install {QUANT_PACKAGES[backend]})"
        )


# --------------------------------------------------------------------------- measured bytes


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of every tensor reachable from ``obj`` (tensors, tensor subclasses such as quanto's
    packed ``QTensor``, lists, tuples, dicts and plain objects), each counted once, in its real
    dtype: ``numel x element_size``. Wrapper tensor subclasses are opened with
    ``__tensor_flatten__`` so their inner codes, scales and zero points are what is counted."""
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        flatten = getattr(type(obj), "__tensor_flatten__", None)
        if flatten is not None and type(obj) is not torch.Tensor:
            names, _ = obj.__tensor_flatten__()
            return sum(tensor_bytes(getattr(obj, n), seen) for n in names)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


# layer attributes that hold cache data; other tensors on a layer (a window-size scalar, a
# prefetch stream) are bookkeeping, not the cache
_LAYER_DATA = ("keys", "values", "_quantized_keys", "_quantized_values")


def cache_bytes(cache: Any) -> int:
    """Measured bytes of a transformers ``Cache``: its layers' key/value tensors (and the
    quantized codes and metadata of a quantized layer) in their real dtypes."""
    seen: set[int] = set()
    return sum(
        tensor_bytes(getattr(layer, name, None), seen)
        for layer in cache.layers
        for name in _LAYER_DATA
    )


# --------------------------------------------------------------------------- building caches


def supported_model(model: Any) -> bool:
    """Sinks, quantized and SnapKV caches evict, quantize or compress every layer alike: full
    attention only."""
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    return types is None or all(t == "full_attention" for t in types)


def make_cache(spec: KVSpec, model: Any, device_type: str) -> tuple[Any, dict[str, Any]]:
    """(a fresh transformers Cache for ``spec``, what to record about it in ``meta``)."""
    from transformers import DynamicCache

    config = model.config
    meta: dict[str, Any] = {"kind": spec.kind, "label": spec.label()}
    if spec.kind in ("sinks", "quantized", "snapkv") and not supported_model(model):
        raise ValueError(
            f"kv_cache={spec.kind} needs a model whose layers are all full attention "
            f"({getattr(config, 'model_type', '?')} has sliding-window layers); use plain or offloaded"
        )
    if spec.kind == "plain":
        return DynamicCache(config=config), meta
    if spec.kind == "offloaded":
        if device_type != "cuda":
            meta["offloaded"] = False
            meta["note"] = (
                f"no-op on {device_type}: the KV cache already lives in host memory, so the plain "
                "cache ran; offloading saves accelerator memory only"
            )
            return DynamicCache(config=config), meta
        meta["offloaded"] = True
        return DynamicCache(config=config, offloading=True), meta
    if spec.kind == "snapkv":
        from ragbench.llm import kv_compress

        return kv_compress.make_snap_cache(spec.ratio, spec.window, model, meta), meta
    if spec.kind == "sinks":
        layers = config.get_text_config(decoder=True).num_hidden_layers
        cache = DynamicCache(config=config)
        cache.layers = [
            sink_layer_class()(spec.sink_tokens, spec.window_tokens) for _ in range(layers)
        ]
        meta.update(sink_tokens=spec.sink_tokens, window_tokens=spec.window_tokens)
        return cache, meta
    # quantized
    from transformers import QuantizedCache

    check_backend_installed(spec.backend)
    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    # transformers' default group of 64 values; HQQ needs the tensor's size divisible by the
    # group, which a head dim below 64 (test models) would break: never cross a head's values
    group = math.gcd(QUANT_GROUP_SIZE, head_dim)
    meta.update(bits=spec.bits, backend=spec.backend, q_group_size=group)
    cache = QuantizedCache(backend=spec.backend, config=config, nbits=spec.bits, q_group_size=group)
    return cache, meta


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
            stored = self.keys.shape[-2] if self.is_initialized else 0
            return stored + query_length, self.cumulative_length - stored

        def get_seq_length(self) -> int:
            return self.cumulative_length

        def get_max_length(self) -> int:
            return self.sinks + self.window

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("a sink cache has evicted positions: it cannot be cropped")

    return SinkLayer


def refuse_variants(requests: Any, backend: str, supported: tuple[str, ...] = ("plain",)) -> None:
    """Raise ValueError for a request whose ``kv_cache`` this backend cannot keep, naming what it
    supports and where the variants run (the transformers backend). Pure."""
    for r in requests:
        if r.kv_cache not in supported:
            raise ValueError(
                f"the {backend} backend cannot run kv_cache={r.kv_cache!r}: it supports "
                f"{list(supported)}; the variants {list(KV_CACHES)} run on the transformers "
                "backend (llm backend 'hf')"
            )
