"""Capacity and price arithmetic before any run: how many sequences fit on a GPU, $/1k queries
for hosted APIs vs self-hosted GPUs, and when a prefix cache makes long context as cheap as RAG.

Pure functions of numbers, a model preset and a price sheet (every dollar through
``ragbench.cost.money.dollars``); the tables notebook 04 plots, and the break-even read from a
run's table, are ``ragbench.analysis.planning``'s. Self-hosted estimates take throughputs as
inputs: measure them with ``make bench-llm`` (or on your server) instead of trusting a default.

KV sizes here are capacity figures: ``context_tokens`` is the number of positions a sequence may
hold, so pass the length you must reserve for (prompt + max new tokens, or the window). A finished
query's cache holds one position fewer (the last token is never fed back; the per-record
``kv_cache_bytes`` counts P + G - 1), a one-token over-reservation that errs on the safe side.
Bytes per value default to 2 (a bf16/fp16 cache), an assumption: pass 4 for float32, 1 for an fp8
cache (``ragbench.cost.accounting.dtype_bytes`` maps dtype names).
"""

from __future__ import annotations

import math

from ragbench.cost.accounting import DEFAULT_KV_BYTES_PER_VALUE, kv_cache_bytes
from ragbench.cost.money import Usage, dollars
from ragbench.cost.prices import PriceSheet, price_sheet
from ragbench.models import ModelPreset, get_preset

GIB = 1024**3
CACHE_USES = ("none", "write", "read")  # a question's prefix: not cached, written, read


def preset_of(p: str | ModelPreset) -> ModelPreset:
    """A model preset by name, or the preset itself."""
    return get_preset(p) if isinstance(p, str) else p


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
    p = preset_of(preset)
    free = gpu_memory_gib * GIB * (1 - reserve_fraction) - p.params * weight_bytes_per_param
    per_seq = kv_cache_bytes(
        p.layers, p.kv_heads, p.head_dim, context_tokens, 1, kv_bytes_per_value
    )
    return max(0, int(free // per_seq))


def api_dollars_per_1k(
    sheet: str | PriceSheet, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> float:
    """$ per 1,000 queries of this shape on a per-token price sheet."""
    sheet = price_sheet(sheet) if isinstance(sheet, str) else sheet
    if sheet.kind != "api":
        raise ValueError(
            f"price sheet {sheet.name!r} is {sheet.kind!r}; use self_hosted_dollars_per_1k"
        )
    usage = Usage(prompt_tokens, cached_tokens, completion_tokens)
    return dollars(sheet, usage, queries=1000)


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
    return dollars(sheet, seconds=seconds, queries=1000)


# ---------------------------------------------------------------------------- prefix-cache break-even


def api_sheet(sheet: str | PriceSheet) -> PriceSheet:
    """``sheet`` loaded, checked to be per-token: what prefix-cache pricing needs."""
    sheet = price_sheet(sheet) if isinstance(sheet, str) else sheet
    if sheet.kind != "api":
        raise ValueError(
            f"price sheet {sheet.name!r} is {sheet.kind!r}: prefix-cache pricing needs a per-token "
            f"(kind: api) sheet; a self-hosted cache saves prefill seconds, see "
            f"self_hosted_dollars_per_1k(cached_tokens=...)"
        )
    return sheet


def long_context_question_dollars(
    sheet: PriceSheet, prompt: float, completion: float, prefix: float, cache: str
) -> float:
    """One long-context question: its ``prefix`` tokens written to the provider's cache
    ("write", the document's first question), read from it ("read", the later ones) or not
    cached ("none"; ``CACHE_USES``)."""
    if cache not in CACHE_USES:
        raise ValueError(f"cache must be one of {list(CACHE_USES)}, got {cache!r}")
    prefix = min(prefix, prompt)
    usage = Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_prompt_tokens=prefix if cache == "read" else 0,
        cache_write_tokens=prefix if cache == "write" else 0,
    )
    return dollars(sheet, usage)


def cached_dollars_per_question(first: float, later: float, questions: int) -> float:
    """$ per question over ``questions`` questions on one document with a prefix cache: the
    first writes the document (``first``), the others read it (``later``)."""
    return (first + (questions - 1) * later) / questions


def break_even_questions(first: float, later: float, rag: float) -> float:
    """Questions per document at which long context with a prefix cache (``first``, then
    ``later`` per question) costs what RAG does (``rag`` every question):
    ``q* = (first - later) / (rag - later)`` when RAG costs more than a cached question; 1.0 when
    long context is no dearer from the first question; inf: never."""
    if first <= rag:
        return 1.0
    if rag > later:
        return (first - later) / (rag - later)
    return math.inf


def cheaper_from(q_star: float) -> int | None:
    """The smallest whole number of questions per document at which long context costs no more
    than RAG (``break_even_questions``); None: never."""
    return None if math.isinf(q_star) else max(1, math.ceil(q_star - 1e-9))
