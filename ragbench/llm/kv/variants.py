"""KV-cache variants for the transformers backend, and the cache's measured size in bytes.

A long-context query's memory is dominated by its KV cache (``cost.kv_cache_bytes``); the
techniques that make long context affordable change how that cache is kept. Each is one small
frozen class that owns its parameters, their validation, its label and the cache it builds
(kvpress style: ``SnapKV(ratio=0.5, window=32)``); a ``GenerationRequest`` carries one as
``kv`` (None: plain), and the ``long_context`` strategy's ``kv`` parameter is one, written
nested in YAML (``kv: {name: quantized, bits: 4}``, or ``kv: sinks``: ``kv_from_spec``).

- ``Plain``: transformers' ``DynamicCache``, in the model's dtype. The reference.
- ``Offloaded``: ``DynamicCache(offloading=True)``: every layer's KV goes back to host memory
  after its use and is prefetched for the next layer (tiered KV). It only means something on an
  accelerator; on a CPU the cache already lives in host memory, so there it is a recorded no-op
  (``meta["kv_cache"]["note"]``) that runs the plain cache, never a pretend saving.
- ``Sinks``: sliding window with attention sinks (StreamingLLM, Xiao et al. 2023,
  arXiv:2309.17453): keep the first ``sink_tokens`` and the last ``window_tokens`` positions and
  evict the middle (``kv/sinks.py`` says why it is implemented here).
  Sinks and SnapKV are presses (``kv/press.py``, kvpress's pattern): scoring rules over a
  cache layer that keeps each head's top-scored positions.
- ``Quantized``: transformers' ``QuantizedCache`` (KIVI-style, Liu et al. 2024,
  arXiv:2402.02750): keys and values quantized per channel in groups, with a short residual of
  recent positions kept in full precision. Backends: ``hqq`` (1, 2, 3, 4 or 8 bits) and ``quanto``
  (``optimum-quanto``: 2 or 4 bits in this transformers version); ``pip install 'ragbench[kvquant]'``.
- ``SnapKV``: SnapKV (Li et al. 2024, arXiv:2404.14469; ``kv/snapkv.py``, which says why not
  kvpress): after the prefill, each KV head keeps the ``ratio`` of the positions before the
  last ``window`` prompt positions that the window (the question) attends to most, plus the
  window. Per question: the kept positions depend on the question, so no prefix is shared.

Adding a variant takes one class here (a ``KVVariant`` subclass: its ``name``, its parameters
as dataclass fields with their ranges, any other validation in ``__post_init__``, ``label``
and ``make_cache``) and one line registering it in ``KV_CACHES``. Its parameters are declared there only: a config names them
under ``kv`` (``kv: {name: <it>, <parameter>: ...}``), records and completion-cache keys store
``spec()``, and every other layer reads only the variant's interface.

Measured bytes (``cache_bytes``) are the tensors the cache object holds, in their real dtype:
packed integer codes, scales and zero points of a quantized cache included. For the plain cache
this equals the formula ``2 x layers x kv_heads x head_dim x positions x bytes`` exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar, Protocol

from pydantic import Field

from ragbench.llm.base import Capabilities
from ragbench.llm.kv import snapkv as kv_compress
from ragbench.llm.kv.press import check_attention, press_cache
from ragbench.llm.kv.sinks import SinkPress
from ragbench.ranges import violation
from ragbench.registry import Registry, did_you_mean, unknown

if TYPE_CHECKING:
    from transformers import Cache, PreTrainedModel

# bits each quantization backend accepts with transformers 5.x (its QuantizedLayer checks)
QUANT_BACKENDS: dict[str, tuple[int, ...]] = {"hqq": (1, 2, 3, 4, 8), "quanto": (2, 4)}
QUANT_PACKAGES = {"hqq": "hqq", "quanto": "optimum-quanto"}
DEFAULT_SINK_TOKENS = 4  # StreamingLLM's choice: 4 initial tokens suffice as attention sinks
DEFAULT_WINDOW_TOKENS = 1024
QUANT_GROUP_SIZE = 64  # values per quantization group (transformers' default)
RATIO_HELP = "the fraction of the prefix kept, e.g. 0.5"  # SnapKV's ratio, in its errors


@dataclass(frozen=True)
class KVVariant:
    """How one request's KV cache is kept. Subclasses: frozen dataclasses whose fields are the
    variant's parameters, their ranges declared on the field (``Annotated[int, Field(ge=1)]``:
    ``ragbench.ranges``); ``__post_init__`` checks those and any other rule (errors name the
    valid choices)."""

    name: ClassVar[str] = ""  # the registry name (``kv: {name: ...}``)
    full_attention_only: ClassVar[bool] = True  # evicts/quantizes/compresses every layer alike

    def __post_init__(self) -> None:
        bad = violation(self)
        if bad is not None:
            raise ValueError(bad.needs(f"kv {self.name}"))

    def label(self) -> str:
        """The benchmark name: ``plain``, ``sinks-4+1024``, ``quantized-hqq-int8``, ..."""
        return self.name

    def spec(self) -> dict[str, object]:
        """The stored form, ``{"name": ..., <parameter>: value, ...}`` (every parameter, at its
        default too): what a config writes under ``kv``, records store and completion-cache
        keys hash. ``kv_from_spec`` reads it back."""
        return {"name": self.name} | {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }

    def meta(self) -> dict[str, object]:
        """What a completion records about its cache (``meta["kv_cache"]``), before building."""
        return {"kind": self.name, "label": self.label()}

    def prefill_chunk(self) -> int | None:
        """Prefill in chunks of this many tokens (None: one pass)."""
        return None

    def check_model(self, model: PreTrainedModel, name: str = "") -> None:
        """Raise ValueError (before any work starts) when ``model`` cannot keep this cache."""
        if self.full_attention_only and not supported_model(model):
            raise ValueError(
                f"kv {self.name} needs a model whose layers are all full attention; "
                f"{name or model.config.model_type} has sliding-window layers: use kv plain "
                "or offloaded"
            )

    def make_cache(
        self, model: PreTrainedModel, device_type: str
    ) -> tuple[Cache, dict[str, object]]:
        """(a fresh transformers Cache kept this way, what to record about it in ``meta``)."""
        raise NotImplementedError(f"kv {self.name} builds no cache")


@dataclass(frozen=True)
class Plain(KVVariant):
    """transformers' DynamicCache in the model's dtype: the reference."""

    name: ClassVar[str] = "plain"
    full_attention_only: ClassVar[bool] = False

    def make_cache(
        self, model: PreTrainedModel, device_type: str
    ) -> tuple[Cache, dict[str, object]]:
        from transformers import DynamicCache

        return DynamicCache(config=model.config), self.meta()


@dataclass(frozen=True)
class Offloaded(KVVariant):
    """Each layer's KV in host memory between uses (a recorded no-op on CPU)."""

    name: ClassVar[str] = "offloaded"
    full_attention_only: ClassVar[bool] = False

    def make_cache(
        self, model: PreTrainedModel, device_type: str
    ) -> tuple[Cache, dict[str, object]]:
        from transformers import DynamicCache

        meta = self.meta()
        if device_type != "cuda":
            meta["offloaded"] = False
            meta["note"] = (
                f"no-op on {device_type}: the KV cache already lives in host memory, so the plain "
                "cache ran; offloading saves accelerator memory only"
            )
            return DynamicCache(config=model.config), meta
        meta["offloaded"] = True
        return DynamicCache(config=model.config, offloading=True), meta


@dataclass(frozen=True)
class Sinks(KVVariant):
    """StreamingLLM: the first sink_tokens and the last window_tokens positions, the middle evicted."""

    # first positions always kept (StreamingLLM)
    sink_tokens: Annotated[int, Field(ge=1, strict=True)] = DEFAULT_SINK_TOKENS
    # most recent positions kept
    window_tokens: Annotated[int, Field(ge=1, strict=True)] = DEFAULT_WINDOW_TOKENS

    name: ClassVar[str] = "sinks"

    def label(self) -> str:
        return f"sinks-{self.sink_tokens}+{self.window_tokens}"

    def prefill_chunk(self) -> int | None:
        # chunks of the window, so no prompt token sees past sinks + window (see kv_sinks)
        return self.window_tokens

    def make_cache(
        self, model: PreTrainedModel, device_type: str
    ) -> tuple[Cache, dict[str, object]]:
        self.check_model(model)
        cache = press_cache(SinkPress(self.sink_tokens, self.window_tokens), model)
        meta = self.meta() | {"sink_tokens": self.sink_tokens, "window_tokens": self.window_tokens}
        return cache, meta


@dataclass(frozen=True)
class Quantized(KVVariant):
    """KIVI-style quantized keys and values (hqq: 1-4 or 8 bits; quanto: 2 or 4)."""

    bits: int  # bits per value (hqq: 1-4, 8; quanto: 2, 4)
    backend: str = "hqq"  # hqq | quanto

    name: ClassVar[str] = "quantized"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in QUANT_BACKENDS:
            raise unknown("kv quantized backend", str(self.backend), list(QUANT_BACKENDS))
        if self.bits not in QUANT_BACKENDS[self.backend]:
            raise ValueError(
                f"kv quantized backend {self.backend!r} supports bits "
                f"{list(QUANT_BACKENDS[self.backend])}, got {self.bits!r}"
            )

    def label(self) -> str:
        return f"quantized-{self.backend}-int{self.bits}"

    def check_model(self, model: PreTrainedModel, name: str = "") -> None:
        super().check_model(model, name)
        check_backend_installed(self.backend)

    def make_cache(
        self, model: PreTrainedModel, device_type: str
    ) -> tuple[Cache, dict[str, object]]:
        from transformers import QuantizedCache

        self.check_model(model)
        text = model.config.get_text_config(decoder=True)
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        # transformers' default group of 64 values; HQQ needs the tensor's size divisible by the
        # group, which a head dim below 64 (test models) would break: never cross a head's values
        group = math.gcd(QUANT_GROUP_SIZE, head_dim)
        meta = self.meta() | {"bits": self.bits, "backend": self.backend, "q_group_size": group}
        cache = QuantizedCache(
            backend=self.backend, config=model.config, nbits=self.bits, q_group_size=group
        )
        return cache, meta


@dataclass(frozen=True)
class SnapKV(KVVariant):
    """SnapKV: keep the ratio of prompt positions the question's window attends to most."""

    # fraction of the positions before the window kept
    ratio: Annotated[float, Field(gt=0, le=1, strict=True, description=RATIO_HELP)] = (
        kv_compress.DEFAULT_RATIO
    )
    # observation window (last prompt positions, kept)
    window: Annotated[int, Field(ge=1, strict=True)] = kv_compress.DEFAULT_WINDOW

    name: ClassVar[str] = "snapkv"

    def label(self) -> str:
        return f"snapkv-{self.ratio:g}-w{self.window}"

    def check_model(self, model: PreTrainedModel, name: str = "") -> None:
        super().check_model(model, name)
        check_attention(model, self.name, name)

    def make_cache(
        self, model: PreTrainedModel, device_type: str
    ) -> tuple[Cache, dict[str, object]]:
        self.check_model(model)
        meta = self.meta()
        return kv_compress.make_snap_cache(self.ratio, self.window, model, meta), meta


# name -> variant class; iterating yields the names. A new variant: its class + one line here.
KV_CACHES = Registry(
    "kv_cache",
    {
        "plain": Plain,
        "offloaded": Offloaded,
        "sinks": Sinks,
        "quantized": Quantized,
        "snapkv": SnapKV,
    },
)


def kv_from_spec(spec: object = None) -> KVVariant:
    """The variant a config or a stored record names: ``None`` (plain), a name (``"sinks"``:
    its defaults), a mapping ``{"name": ..., <parameter>: value}`` (``spec()``'s form; a
    parameter left out or null takes the class's default) or a variant itself. Unknown names
    and parameters are errors naming the valid ones; the class validates the values."""
    if isinstance(spec, KVVariant):
        return spec
    if spec is None:
        return Plain()
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict):
        raise ValueError(
            f"kv must be a variant name or a mapping {{name: ..., <parameter>: ...}}, got {spec!r}"
        )
    params = dict(spec)
    name = params.pop("name", None)
    if not isinstance(name, str) or name not in KV_CACHES:
        raise unknown("kv name", str(name), KV_CACHES)
    cls = KV_CACHES.get(name)
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in params:
        if key not in valid:
            raise ValueError(
                f"kv {name} has no parameter {key!r}; "
                + (did_you_mean(str(key), valid) if valid else "it takes none")
            )
    given = {k: v for k, v in params.items() if v is not None}
    for f in dataclasses.fields(cls):
        if f.name not in given and f.default is dataclasses.MISSING:
            raise ValueError(f"kv {name} needs {f.name}: kv: {{name: {name}, {f.name}: ...}}")
    return cls(**given)


class HasKV(Protocol):
    """A request or a config's strategy point: anything with a ``kv``."""

    @property
    def kv(self) -> KVVariant | None: ...


def variant_of(request: HasKV) -> KVVariant:
    """A request's variant (``GenerationRequest.kv``; None is plain)."""
    return request.kv if request.kv is not None else Plain()


def variants_run(capabilities: Capabilities, params: Mapping[str, object]) -> tuple[str, ...]:
    """The variants a backend keeps, from its ``capabilities`` (``ragbench.llm.base``) and the
    model ``params`` it is built with: all where it runs them (or simulates them, when asked:
    ``simulate_kv_cache: true``), else plain only. What ``refuse_variants`` checks against."""
    simulated = capabilities.simulates_kv_cache and bool(params.get("simulate_kv_cache"))
    return tuple(KV_CACHES) if capabilities.kv_variants or simulated else ("plain",)


def refuse_variants(
    requests: Iterable[HasKV], backend: str, supported: Collection[str] = ("plain",)
) -> None:
    """Raise ValueError for a request (or a config's strategy point: anything with a ``kv``)
    whose KV-cache variant this backend cannot keep, naming what it supports and where the
    variants run (the transformers backend). Pure."""
    for r in requests:
        name = variant_of(r).name
        if name not in supported:
            raise ValueError(
                f"the {backend} backend cannot run kv {name!r}: it supports "
                f"{list(supported)}; the variants {list(KV_CACHES)} run on the transformers "
                "backend (llm backend 'hf')"
            )


def supported_model(model: PreTrainedModel) -> bool:
    """Sinks, quantized and SnapKV caches evict, quantize or compress every layer alike: full
    attention only."""
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    return types is None or all(t == "full_attention" for t in types)


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
            f"kv quantized with backend {backend!r} needs the {QUANT_PACKAGES[backend]!r} "
            f"package: pip install 'ragbench[kvquant]' (or pip install {QUANT_PACKAGES[backend]})"
        )


# --------------------------------------------------------------------------- measured bytes


def tensor_bytes(obj: object, seen: set[int] | None = None) -> int:
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
            names, _ = flatten(obj)  # a tensor subclass's parts (torch's wrapper protocol)
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


def cache_bytes(cache: Cache) -> int:
    """Measured bytes of a transformers ``Cache``: its layers' key/value tensors (and the
    quantized codes and metadata of a quantized layer) in their real dtypes."""
    seen: set[int] = set()
    return sum(
        tensor_bytes(getattr(layer, name, None), seen)
        for layer in cache.layers
        for name in _LAYER_DATA
    )
