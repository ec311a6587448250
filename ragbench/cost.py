"""Cost per query: tokens, latency, FLOPs, KV-cache bytes, MFU and dollars.

Everything here is a pure function of a ``Completion`` (the backend's accounting), a model's
architecture facts (``ragbench.llm.presets.ModelPreset``) and a price sheet (a YAML data file
with a date and a source note; no price lives in this module).

FLOPs model (forward pass only, per query). Write P = prompt tokens, C = cached prompt tokens
(a reused prefix KV cache: those positions are not recomputed), G = completion tokens,
N = non-embedding parameters (Kaplan et al. 2020), L = layers, H = query heads, d = head dim.

* Positions that run through the network: the prefill computes positions C+1..P and emits the
  first completion token; each further completion token is one decode step, so positions
  P+1..P+G-1 run too. Tokens processed T = (P - C) + max(G - 1, 0).
* Dense term: each parameter is one multiply-add (2 FLOPs) per processed token: ``2 N T``.
  Embedding lookups and the LM head are excluded, as in Kaplan's N (the transformers backend
  computes logits for the last position only).
* Attention term: the token at position i attends to i keys (causal, itself included). Per
  layer and head, QK^T is i*d multiply-adds and the weighted sum AV another i*d, so
  4*i*d FLOPs; summed over heads and layers, 4*L*H*d*i. Query heads count: grouped-query
  attention shrinks the KV cache, not these products. Over the processed positions:
  ``4 L H d * sum_{i=C+1}^{P+G-1} i``. For a full prefill of n tokens that is
  4*L*H*d*n(n+1)/2 ~= 2*L*H*d*n^2: the causal half of the 4*L*H*d*n^2 a bidirectional pass
  would cost. It passes the dense term once n > N / (L*H*d) tokens (about 2.7k for SmolLM2).
* Softmax, norms and sliding windows are ignored; with sliding-window layers (Gemma 3) the
  attention term is an upper bound.

KV cache per query (the ``kv_cache_bytes`` record column): after the last step the cache holds
the positions that ran plus the cached prefix, P + max(G - 1, 0) (the last completion token is
sampled, never fed back), times 2 (keys and values) x L x KV heads x d x bytes per value. Bytes per
value come from the dtype the cache is stored in (``dtype_bytes``): the transformers backend keeps
it in the model's dtype, which its ``identity()["dtype"]`` reports (float32 on CPU by default: 4
bytes). When the dtype is unknown (hosted APIs, servers) 2 bytes is *assumed*, the common serving
dtype (bf16/fp16); the record's ``kv_bytes_per_value`` says which was used. Batch padding and a
server's block rounding are not counted: this is one sequence's own cache.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ragbench.io import InputFileError
from ragbench.registry import unknown
from ragbench.types import Completion

PRICES_DIR = Path(__file__).parent / "data" / "prices"


# ---------------------------------------------------------------------------- memory and compute


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
    batch: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Bytes of keys + values: ``2 x layers x kv_heads x head_dim x seq_len x batch x bytes``.

    The textbook example (100 layers, 80 heads, head dim 128, 10^6 tokens, batch 1, 2 bytes)
    gives 4,096,000,000,000 bytes: 4.1 TB, 3.7 TiB, or the "3.8 TB" quoted as 3,815 GiB / 1000.
    """
    args = dict(layers=layers, kv_heads=kv_heads, head_dim=head_dim, seq_len=seq_len, batch=batch)
    for name, v in {**args, "bytes_per_value": bytes_per_value}.items():
        if v < 0:
            raise ValueError(f"kv_cache_bytes: {name} must be >= 0, got {v}")
    return 2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_value


DEFAULT_KV_BYTES_PER_VALUE = 2  # assumed when the dtype is unknown: bf16/fp16 serving
# dtype name (torch's, without "torch.") -> bytes per value; float8_* variants are 1 byte
_DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "fp16": 2,
    "fp32": 4,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
}


def dtype_bytes(dtype: Any = None, default: int = DEFAULT_KV_BYTES_PER_VALUE) -> int:
    """Bytes per value of ``dtype`` ("float32", "torch.bfloat16", a torch dtype, "float8_e4m3fn").

    None or "" (unknown) gives ``default``, an assumption; an unrecognised name is an error.
    """
    if dtype is None or str(dtype).strip() == "":
        return default
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name in _DTYPE_BYTES:
        return _DTYPE_BYTES[name]
    if name.startswith(("float8", "fp8")):
        return 1
    raise unknown("dtype", str(dtype), [*_DTYPE_BYTES, "float8_*"])


def query_kv_positions(prompt_tokens: int, completion_tokens: int) -> int:
    """Positions in one query's KV cache when generation ends: P + max(G - 1, 0)."""
    return prompt_tokens + max(completion_tokens - 1, 0)


def _arch(preset_or_arch: Any) -> tuple[int, int, int, int]:
    """(non_embedding_params, layers, heads, head_dim) from a ModelPreset or a mapping."""
    keys = ("non_embedding_params", "layers", "heads", "head_dim")
    if isinstance(preset_or_arch, dict):
        missing = [k for k in keys if k not in preset_or_arch]
        if missing:
            raise ValueError(f"architecture is missing {missing}; needs {list(keys)}")
        return tuple(int(preset_or_arch[k]) for k in keys)  # type: ignore[return-value]
    return tuple(int(getattr(preset_or_arch, k)) for k in keys)  # type: ignore[return-value]


def processed_positions(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> range:
    """1-based positions that run through the network (see the module docstring)."""
    if not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError(
            f"cached_tokens {cached_tokens} must be in [0, prompt_tokens={prompt_tokens}]"
        )
    if completion_tokens < 0:
        raise ValueError(f"completion_tokens must be >= 0, got {completion_tokens}")
    return range(cached_tokens + 1, prompt_tokens + max(completion_tokens - 1, 0) + 1)


def forward_flops(
    preset_or_arch: Any, prompt_tokens: int, cached_tokens: int = 0, completion_tokens: int = 0
) -> dict[str, int]:
    """Forward FLOPs of one query: {"dense", "attention", "total"} (formula in the module doc)."""
    n_params, layers, heads, head_dim = _arch(preset_or_arch)
    pos = processed_positions(prompt_tokens, cached_tokens, completion_tokens)
    tokens = len(pos)
    position_sum = (pos.start + pos.stop - 1) * tokens // 2 if tokens else 0  # arithmetic series
    dense = 2 * n_params * tokens
    attention = 4 * layers * heads * head_dim * position_sum
    return {"dense": dense, "attention": attention, "total": dense + attention}


def mfu(flops: float, seconds: float, peak_flops: float) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the hardware peak (None if unmeasurable)."""
    if not seconds or seconds <= 0 or not peak_flops or peak_flops <= 0:
        return None
    return float(flops) / (seconds * peak_flops)


# ---------------------------------------------------------------------------- price sheets

_API_FIELDS = ("input_per_million", "cached_input_per_million", "output_per_million")
_GPU_FIELDS = ("gpu_hour", "gpus")
_COMMON = ("name", "kind", "date", "source", "currency")
_OPTIONAL = ("hardware", "peak_flops", "note")


@dataclass(frozen=True)
class PriceSheet:
    """One price sheet. ``kind="api"``: $ per million tokens; ``kind="gpu_hour"``: $ per hour."""

    name: str
    kind: str
    date: str
    source: str
    currency: str = "USD"
    prices: dict[str, float] = field(default_factory=dict)
    hardware: str = ""
    peak_flops: float | None = None
    path: str = ""


def available_price_sheets() -> list[str]:
    return sorted(p.stem for p in PRICES_DIR.glob("*.yaml"))


def price_sheet(name_or_path: str | os.PathLike) -> PriceSheet:
    """Load a shipped sheet by name (``ragbench/data/prices/<name>.yaml``) or any YAML path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        if str(name_or_path) not in available_price_sheets():
            raise unknown(
                "price sheet", str(name_or_path), [*available_price_sheets(), "<path.yaml>"]
            )
        path = PRICES_DIR / f"{name_or_path}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise InputFileError(
            path, None if line is None else line + 1, f"invalid YAML: {exc}"
        ) from None
    return parse_price_sheet(data, str(path))


def parse_price_sheet(data: Any, where: str = "<price sheet>") -> PriceSheet:
    if not isinstance(data, dict):
        raise InputFileError(where, None, "a price sheet must be a YAML mapping")
    kind = data.get("kind")
    if kind not in ("api", "gpu_hour"):
        raise InputFileError(where, None, f"kind must be 'api' or 'gpu_hour', got {kind!r}", "kind")
    price_fields = _API_FIELDS if kind == "api" else _GPU_FIELDS
    valid = set(_COMMON + _OPTIONAL + price_fields)
    for key in data:
        if key not in valid:
            from ragbench.registry import did_you_mean

            raise InputFileError(where, None, f"unknown key; {did_you_mean(key, valid)}", key)
    for key in ("name", "date", "source", *price_fields):
        if data.get(key) in (None, ""):
            raise InputFileError(
                where, None, "required (every sheet carries a date and a source)", key
            )
    prices: dict[str, float] = {}
    for key in price_fields:
        value = data[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise InputFileError(where, None, f"must be a number >= 0, got {value!r}", key)
        prices[key] = float(value)
    peak = data.get("peak_flops")
    return PriceSheet(
        name=str(data["name"]),
        kind=kind,
        date=str(data["date"]),
        source=str(data["source"]).strip(),
        currency=str(data.get("currency", "USD")),
        prices=prices,
        hardware=str(data.get("hardware", "")),
        peak_flops=float(peak) if peak is not None else None,
        path=where,
    )


# ---------------------------------------------------------------------------- money


def gpu_seconds(completion: Completion, gpus: float = 1.0) -> float:
    """Measured accelerator time of one completion x devices held.

    A backend that batches reports each row's share of the device time in ``meta["gpu_seconds"]``
    (the transformers backend: the shares of one batch add up to its wall time); otherwise the
    completion's wall seconds, which is what it held the devices for.
    """
    share = (completion.meta or {}).get("gpu_seconds")
    return (completion.total_seconds if share is None else float(share)) * gpus


def dollars_per_query(completion: Completion, sheet: PriceSheet) -> float:
    """API: uncached input, cached input and output tokens at their per-million prices.
    Self-hosted: the hourly price x measured GPU-seconds / 3600."""
    p = sheet.prices
    if sheet.kind == "api":
        uncached = completion.prompt_tokens - completion.cached_prompt_tokens
        return (
            uncached * p["input_per_million"]
            + completion.cached_prompt_tokens * p["cached_input_per_million"]
            + completion.completion_tokens * p["output_per_million"]
        ) / 1e6
    return p["gpu_hour"] * gpu_seconds(completion, p["gpus"]) / 3600.0


# ---------------------------------------------------------------------------- record fields

# Fields summed when one query makes several calls (self_route: RAG then long context);
# the others (kv_cache_bytes, peak memory) take the maximum; mfu is recomputed.
ADDITIVE = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "prefill_seconds",
    "decode_seconds",
    "total_seconds",
    "gpu_seconds",
    "flops",
    "flops_attention",
    "dollars",
    "llm_calls",
)


def cost_fields(
    completion: Completion,
    preset: Any = None,
    sheet: PriceSheet | None = None,
    kv_dtype: Any = None,
) -> dict[str, Any]:
    """The cost columns of one Record. ``preset`` (architecture) and ``sheet`` are optional:
    without them flops/kv bytes or dollars are None, never guessed.

    ``kv_dtype`` is the dtype the KV cache was stored in (for the transformers backend, the
    model's: ``llm.identity()["dtype"]``). Unknown (None) assumes 2 bytes per value (bf16/fp16);
    ``kv_bytes_per_value`` records the value used."""
    out: dict[str, Any] = {
        "prompt_tokens": completion.prompt_tokens,
        "cached_prompt_tokens": completion.cached_prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "prefill_seconds": completion.prefill_seconds,
        "decode_seconds": completion.decode_seconds,
        "total_seconds": completion.total_seconds,
        "gpu_seconds": gpu_seconds(completion),  # device time charged (a batch row: its share)
        "peak_memory_bytes": completion.peak_memory_bytes,
        "usage_estimated": completion.usage_estimated,
        "llm_calls": 1,
        "flops": None,
        "flops_attention": None,
        "kv_cache_bytes": None,
        "kv_bytes_per_value": None,
        "dollars": None,
        "mfu": None,
        "price_sheet": sheet.name if sheet else None,
    }
    if preset is not None:
        f = forward_flops(
            preset,
            completion.prompt_tokens,
            completion.cached_prompt_tokens,
            completion.completion_tokens,
        )
        out["flops"], out["flops_attention"] = f["total"], f["attention"]
        seq = query_kv_positions(completion.prompt_tokens, completion.completion_tokens)
        per_value = dtype_bytes(kv_dtype)
        out["kv_cache_bytes"] = kv_cache_bytes(
            preset.layers, preset.kv_heads, preset.head_dim, seq, 1, per_value
        )
        out["kv_bytes_per_value"] = per_value
    if sheet is not None:
        out["dollars"] = dollars_per_query(completion, sheet)
        if out["flops"] is not None and sheet.peak_flops:
            out["mfu"] = mfu(out["flops"], out["gpu_seconds"], sheet.peak_flops)
    return out


def combine_costs(parts: list[dict[str, Any]], peak_flops: float | None = None) -> dict[str, Any]:
    """Cost of a query made of several calls: additive fields summed, memory fields maxed."""
    if not parts:
        raise ValueError("combine_costs needs at least one cost dict")
    out = dict(parts[-1])
    for key in parts[0]:
        values = [p.get(key) for p in parts]
        if key in ADDITIVE:
            out[key] = None if any(v is None for v in values) else sum(values)
        elif key in ("kv_cache_bytes", "peak_memory_bytes"):
            known = [v for v in values if v is not None]
            out[key] = max(known) if known else None
        elif key == "usage_estimated":
            out[key] = any(values)
    out["mfu"] = mfu(out["flops"], out["gpu_seconds"], peak_flops) if out.get("flops") else None
    return out


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. 3.7 TiB."""
    if n <= 0:
        return "0 B"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = min(int(math.log(n, 1024)), len(units) - 1)
    return f"{n / 1024**i:.1f} {units[i]}"
