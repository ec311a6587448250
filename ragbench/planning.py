"""Capacity and price planning before any run: KV-cache memory, how many sequences fit on a GPU,
$/1k queries for hosted APIs vs self-hosted GPUs, and what prefix caching changes.

Pure functions over ``ragbench.cost`` and the model presets; notebook 04 plots their tables.
Self-hosted estimates take throughputs as inputs: measure them with ``make bench-llm`` (or on
your server) instead of trusting a default.

KV sizes here are capacity figures: ``context_tokens`` is the number of positions a sequence may
hold, so pass the length you must reserve for (prompt + max new tokens, or the window). A finished
query's cache holds one position fewer (the last token is never fed back; the per-record
``kv_cache_bytes`` counts P + G - 1), a one-token over-reservation that errs on the safe side.
Bytes per value default to 2 (a bf16/fp16 cache), an assumption: pass 4 for float32, 1 for an fp8
cache (``ragbench.cost.dtype_bytes`` maps dtype names).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragbench.cost import DEFAULT_KV_BYTES_PER_VALUE, kv_cache_bytes
from ragbench.llm.presets import ModelPreset, get_preset
from ragbench.prices import PriceSheet, dollars_per_query, price_sheet
from ragbench.types import Completion

GIB = 1024**3


def _preset(p: str | ModelPreset) -> ModelPreset:
    return get_preset(p) if isinstance(p, str) else p


def kv_cache_table(
    presets: Sequence[str | ModelPreset],
    context_lengths: Sequence[int],
    bytes_per_value: int = DEFAULT_KV_BYTES_PER_VALUE,
) -> Any:
    """KV-cache bytes of one sequence holding ``context_length`` positions, per model and length
    (``bytes_per_value`` 2 assumes a bf16/fp16 cache)."""
    import pandas as pd

    rows = []
    for p in map(_preset, presets):
        for n in context_lengths:
            size = kv_cache_bytes(p.layers, p.kv_heads, p.head_dim, n, 1, bytes_per_value)
            rows.append(
                {"model": p.name, "context_tokens": n, "kv_bytes": size, "kv_gib": size / GIB}
            )
    return pd.DataFrame(rows)


def max_concurrent_sequences(
    preset: str | ModelPreset,
    context_tokens: int,
    gpu_memory_gib: float,
    weight_bytes_per_param: float = 2.0,
    kv_bytes_per_value: int = DEFAULT_KV_BYTES_PER_VALUE,
    reserve_fraction: float = 0.1,
) -> int:
    """Sequences of ``context_tokens`` whose KV cache fits next to the weights.

    Memory left = GPU memory x (1 - reserve for activations and fragmentation) - weights; each
    sequence needs its full KV cache, ``context_tokens`` positions (the length reserved: prompt +
    max new tokens; see the module docstring). Both byte widths default to a bf16/fp16 model and
    cache. 0 means not even one sequence fits.
    """
    p = _preset(preset)
    free = gpu_memory_gib * GIB * (1 - reserve_fraction) - p.params * weight_bytes_per_param
    per_seq = kv_cache_bytes(
        p.layers, p.kv_heads, p.head_dim, context_tokens, 1, kv_bytes_per_value
    )
    return max(0, int(free // per_seq))


def capacity_table(
    presets: Sequence[str | ModelPreset],
    context_lengths: Sequence[int],
    gpu_memory_gib: float,
    kv_bytes_per_value: int = DEFAULT_KV_BYTES_PER_VALUE,
) -> Any:
    """``max_concurrent_sequences`` as a context length x model table of integers."""
    import pandas as pd

    rows = {
        _preset(p).name: {
            n: max_concurrent_sequences(p, n, gpu_memory_gib, kv_bytes_per_value=kv_bytes_per_value)
            for n in context_lengths
        }
        for p in presets
    }
    return pd.DataFrame(rows).rename_axis(index="context_tokens", columns="model")


def api_dollars_per_1k(
    sheet: str | PriceSheet, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> float:
    """$ per 1,000 queries of this shape on a per-token price sheet."""
    sheet = price_sheet(sheet) if isinstance(sheet, str) else sheet
    if sheet.kind != "api":
        raise ValueError(
            f"price sheet {sheet.name!r} is {sheet.kind!r}; use self_hosted_dollars_per_1k"
        )
    c = Completion("", prompt_tokens, completion_tokens, cached_prompt_tokens=cached_tokens)
    return 1000 * dollars_per_query(c, sheet)


def self_hosted_dollars_per_1k(
    sheet: str | PriceSheet,
    prompt_tokens: int,
    completion_tokens: int,
    prefill_tokens_per_s: float,
    decode_tokens_per_s: float,
    concurrency: int = 1,
    cached_tokens: int = 0,
) -> float:
    """$ per 1,000 queries on a GPU rented by the hour, from measured throughputs.

    GPU-seconds per query = uncached prompt tokens / prefill rate (the whole GPU's) + completion
    tokens / decode rate / ``concurrency`` (sequences decoding together share each step).
    """
    sheet = price_sheet(sheet) if isinstance(sheet, str) else sheet
    if sheet.kind != "gpu_hour":
        raise ValueError(f"price sheet {sheet.name!r} is {sheet.kind!r}; use api_dollars_per_1k")
    # prefill throughput is the whole GPU's (compute-bound): batching does not share it;
    # decode is memory-bound per step, so `concurrency` sequences share each step's time
    seconds = (prompt_tokens - cached_tokens) / prefill_tokens_per_s
    seconds += completion_tokens / decode_tokens_per_s / max(1, concurrency)
    hourly = sheet.prices["gpu_hour"] * sheet.prices["gpus"]
    return 1000 * hourly * seconds / 3600


def prefix_caching_table(
    sheet: str | PriceSheet,
    document_tokens: int,
    question_tokens: int,
    completion_tokens: int,
    questions_per_document: Sequence[int],
) -> Any:
    """Long-context $/question with and without a prefix cache on a per-token price sheet.

    With the cache, the first question on a document pays the full prompt; the others pay the
    cached-input price for the document part. Shows how many questions per document it takes for
    long context to get cheap.
    """
    import pandas as pd

    sheet = price_sheet(sheet) if isinstance(sheet, str) else sheet
    prompt = document_tokens + question_tokens
    full = api_dollars_per_1k(sheet, prompt, completion_tokens) / 1000
    warm = (
        api_dollars_per_1k(sheet, prompt, completion_tokens, cached_tokens=document_tokens) / 1000
    )
    rows = []
    for q in questions_per_document:
        cached = (full + (q - 1) * warm) / q
        rows.append(
            {
                "questions_per_document": q,
                "dollars_per_question_no_cache": full,
                "dollars_per_question_prefix_cache": cached,
                "saving": 1 - cached / full,
            }
        )
    return pd.DataFrame(rows)
