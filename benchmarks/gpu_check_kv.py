"""The KV-cache variants part of ``gpu_check.py``: every variant ``ragbench.llm.kv.variants``
names, on one prompt of random ids, with measured KV bytes and peak memory against
``ragbench.cost.accounting.kv_cache_bytes``. A variant this file has no parameters for, or whose
backend package is missing, is recorded with its error. Also the token-id helpers the parts
share (``random_ids``, ``ids_of``, ``same``)."""

from __future__ import annotations

from ragbench.cost.accounting import kv_cache_bytes
from ragbench.llm.kv import variants as kv_cache
from ragbench.types import GenerationRequest


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n,), generator=g).tolist()


def ids_of(text: str) -> list[int]:
    """Token ids back from ``IdTokenizer``'s "text" (the ids, space-separated)."""
    return [int(t) for t in text.split()]


def same(a: list[list[int]], b: list[list[int]]) -> dict:
    """Generated token ids per row, ``a`` against ``b``: all equal, rows identical, and the
    lowest share of positions that agree in a row."""
    equal = [x == y for x, y in zip(a, b, strict=True)]
    agree = [
        sum(p == q for p, q in zip(x, y, strict=False)) / max(len(x), 1)
        for x, y in zip(a, b, strict=True)
    ]
    return {"all": all(equal), "rows_identical": sum(equal), "token_agreement": min(agree)}


KV_PARAMS: dict[str, list[dict]] = {  # parameters for variants that need them (sinks: window
    "sinks": [{"sink_tokens": 4, "window_tokens": 0}],  # set to a quarter of the document)
    "quantized": [{"bits": 8, "backend": "hqq"}, {"bits": 4, "backend": "quanto"}],
    "snapkv": [{"ratio": 0.5, "window": 32}],  # llm.py's snapkv-0.5
}


def kv_specs(tokens: int) -> list[tuple[str, kv_cache.KVVariant | None, str]]:
    """(label, variant or None, error) for every variant kv_cache.KV_CACHES names, plain first
    (the others' tokens are compared with its)."""
    out = []
    for kind in sorted(kv_cache.KV_CACHES, key=lambda k: k != "plain"):
        for params in KV_PARAMS.get(kind, [{}]):
            if "window_tokens" in params:
                params = {**params, "window_tokens": max(8, tokens // 4)}
            try:
                spec = kv_cache.KV_CACHES.get(kind)(**params)
                out.append((spec.label(), spec, ""))
            except (TypeError, ValueError) as exc:  # a new variant needing unknown parameters
                out.append((kind, None, f"{type(exc).__name__}: {exc}"))
    return out


def bench_kv(model, facts, dec, tokens: int, new: int) -> dict:
    import torch

    ids = random_ids(tokens, model.config.vocab_size, 7)
    req = GenerationRequest("kv", max_new_tokens=new)
    out: dict[str, dict] = {}
    plain_tokens = None
    for label, spec, error in kv_specs(tokens):
        if spec is None:
            out[label] = {"error": error}
            continue
        try:
            spec.check_model(model)  # e.g. a quantization backend package missing
            with torch.inference_mode():
                [row] = dec.decode([req], [ids], None, 0, shared=False, seed=0, kv=spec)
        except (ImportError, ValueError, NotImplementedError, RuntimeError, TypeError) as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"  kv {label}: {out[label]['error']}")
            continue
        tokens_out = ids_of(row["text"])
        plain_tokens = tokens_out if isinstance(spec, kv_cache.Plain) else plain_tokens
        formula = kv_cache_bytes(
            facts["layers"], facts["kv_heads"], facts["head_dim"], tokens, 1, model.dtype.itemsize
        )
        out[label] = {
            "kv_bytes_measured": row["kv_bytes_measured"],
            "kv_bytes_formula": formula,
            "kv_ratio_to_formula": round(row["kv_bytes_measured"] / formula, 4),
            "peak_memory_bytes": row["peak_memory_bytes"],
            "peak_above_weights_bytes": row["peak_memory_bytes"] - facts["weight_bytes"],
            "prefill_seconds": round(row["prefill_seconds"], 4),
            "decode_seconds": round(row["decode_seconds"], 4),
            "same_tokens_as_plain": None if plain_tokens is None else tokens_out == plain_tokens,
            "meta": row["meta"]["kv_cache"],
        }
        print(
            f"  kv {label}: {row['kv_bytes_measured'] / 2**20:.1f} MiB (formula {formula / 2**20:.1f})"
        )
    return out
