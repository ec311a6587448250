"""The ``decode`` and ``logits`` parts of ``gpu_check.py``.

``decode``: the bandwidth floor of a decode step (the weights' bytes over a measured
device-to-device copy bandwidth: a step reads every weight once), then decode milliseconds per
step at batch 1, 8 and 32 on the plain loop (``decode="eager"``) and on the fast path
(``decode="static"``: static KV cache, a CUDA-graph step on CUDA; ``ragbench/llm/hf/static.py``),
each as a multiple of the floor; runner batching of 8 short prompts (one at a time against
one batch) on the fast path, where decode, not prefill, is most of the work; a step after one
long prompt (16k) on both paths (long context is what ragbench prices); and ``targets``: issue
36's figures against their bounds (batch 1 <= 8.5 ms, batch 8 <= 1.3x batch 1, runner batching
>= 5x, every batch's step captured, the fast step after a long prompt no slower than the plain
one), with ``auto_ready`` when every one holds: the measurement that lets ``decode: auto`` take
the static path on CUDA (``hf/static.py``, AUTO_REASON).

``logits``: the logits of the first two picks (the prefill's last position, then the first decode
step) of every ragbench path against transformers' own forward over the same token ids (one
sequence, no cache, no padding): top-1 agreement and max |difference|, plus the reference's
smallest top-1 margin (a disagreement where the margin is below the path's max |difference| is a
near-tie, not a bug). The second step is compared with the forward over the path's own first
pick (after a different first pick the inputs differ, and so do the logits, by tens: the H200's
31-35 of 2026-11). Each flipped first pick is listed with the reference's margin and the row's
max |difference| (``first_token_flips``). In reduced precision the same weights are also run in
float32 (``float32``): the reference and each path's first pick against that truth, so a path
whose kernels round differently shows as close to it as the reference is, and a real error
shows as further. Paths: plain (one request), batched (left padding), prefix reuse (copied and
shared-prefix attention), the fast path (alone, batched, shared prefix), and every KV-cache variant
(``exact``: those that should give the plain cache's numbers: offloaded, sinks with a window that
holds the prompt, SnapKV keeping every position; quantized is compared but not exact).

Initialisation for ``logits`` (random weights otherwise give near-ties in bf16): the residual
branches' output projections (``o_proj``, ``down_proj``) are scaled by 1/sqrt(2 x layers) (GPT-2's
scaled initialisation), so the rounding of each layer is not amplified through 32 random layers;
and the output head is scaled x4 so the logits spread over several units. Scaling the head alone
would not help (the margins and the rounding scale together); it keeps the logits of a float32
CPU run far from the float32 noise.
"""

from __future__ import annotations

import math
import time

from baselines import plain_generate
from gpu_check_kv import ids_of, kv_specs, random_ids, same

from ragbench.llm.hf.decode import Decoder
from ragbench.llm.kv import variants as kv_cache
from ragbench.types import GenerationRequest

BATCHES = (1, 8, 32)


def now(device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def copy_bandwidth(device, nbytes: int) -> dict:
    """Device-to-device copy bandwidth: bytes read + written per second, best of 5."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(5):
        t0 = now(device)
        dst.copy_(src)
        best = min(best, now(device) - t0)
    del src, dst
    return {"bytes": nbytes, "seconds": best, "bytes_per_second": 2 * nbytes / best}


def step_ms(dec: Decoder, rows: int, prompt: int, new: int, repeats: int) -> dict:
    """Milliseconds per decode step with ``rows`` prompts of ``prompt`` random tokens decoded
    ``new`` tokens (new - 1 steps), best of ``repeats`` after a warm-up (kernels, the static
    cache and its captured step)."""
    import torch

    vocab = dec.model.config.vocab_size
    prompts = [random_ids(prompt, vocab, 40 + i) for i in range(rows)]
    reqs = [GenerationRequest(f"d{i}", max_new_tokens=new) for i in range(rows)]
    best, meta = math.inf, {}
    with torch.inference_mode():
        for k in range(repeats + 1):
            out = dec.decode(reqs, prompts, None, 0, shared=False, seed=0)
            seconds = max(r["decode_seconds"] for r in out) / max(1, new - 1)
            if k:  # the first run warms up
                best = min(best, seconds)
            meta = out[0]["meta"]["decode"]
    return {
        "ms": round(best * 1e3, 3),
        "path": meta.get("path"),
        "graph": meta.get("graph"),
        "reason": meta.get("reason") or meta.get("fallback"),
        "capture_check": meta.get("capture_check"),
    }


# issue 36's bounds: (figure, bound, "max" | "min"); the long prompt's is the plain step's
TARGETS = {
    "fast_batch1_ms": 8.5,  # 2.5x the 8B shape's bandwidth floor on an H200
    "fast_batch8_over_batch1": 1.3,
    "runner_batching_fast_speedup": 5.0,
}


def targets(out: dict) -> dict:
    """Each target's figure, bound and whether it holds (None: not measured); ``auto_ready``."""
    fast = out["fast"]
    long = out.get("long_prompt", {})
    figures = {
        "fast_batch1_ms": (fast.get("1", {}).get("ms"), TARGETS["fast_batch1_ms"], "max"),
        "fast_batch8_over_batch1": (
            out.get("fast_batch8_over_batch1"),
            TARGETS["fast_batch8_over_batch1"],
            "max",
        ),
        "runner_batching_fast_speedup": (
            out["runner_batching_fast"].get("speedup"),
            TARGETS["runner_batching_fast_speedup"],
            "min",
        ),
        "long_prompt_fast_ms": (
            long.get("fast", {}).get("ms"),
            long.get("plain", {}).get("ms"),
            "max",
        ),
    }
    got: dict = {}
    for name, (value, bound, kind) in figures.items():
        met = None
        if value is not None and bound is not None:
            met = value <= bound if kind == "max" else value >= bound
        got[name] = {"value": value, kind: bound, "met": met}
    captured = [row.get("graph") == "captured" for row in fast.values()]
    got["captured_every_batch"] = {
        "value": sum(captured),
        "of": len(captured),
        "met": all(captured) if out["cuda_graphs"] else None,
    }
    got["auto_ready"] = all(t["met"] is True for t in got.values())
    return got


def bench_decode(model, facts, device, s: dict, tokenizer, runner) -> dict:
    """The floor, ms per step at each batch on both paths, and runner batching on the fast one
    (``runner``: ``gpu_check.bench_runner``; ``tokenizer``: its ``IdTokenizer``)."""

    size = s["decode"]
    copy = copy_bandwidth(device, size["copy_bytes"])
    floor = facts["weight_bytes"] / copy["bytes_per_second"]
    capture = device.type == "cuda"
    decoders = {
        "plain": Decoder.for_model(model, tokenizer, decode="eager"),
        "fast": Decoder.for_model(model, tokenizer, decode="static", cuda_graphs=capture),
    }
    out = {
        "copy_bandwidth_bytes_per_second": round(copy["bytes_per_second"]),
        "copy_bytes": copy["bytes"],
        "weight_bytes": facts["weight_bytes"],
        "floor_ms": round(floor * 1e3, 4),
        "prompt_tokens": size["prompt"],
        "new_tokens": size["new"],
        "repeats": size["repeats"],
        "cuda_graphs": capture,
    }
    for name, dec in decoders.items():
        rows = {}
        for batch in size["batches"]:
            row = step_ms(dec, batch, size["prompt"], size["new"], size["repeats"])
            row["x_floor"] = round(row["ms"] / 1e3 / floor, 2)
            rows[str(batch)] = row
            print(
                f"  decode {name} batch {batch}: {row['ms']:.2f} ms/step ({row['x_floor']}x floor)"
            )
        out[name] = rows
    one, eight = out["fast"].get("1"), out["fast"].get("8")
    if one and eight:
        out["fast_batch8_over_batch1"] = round(eight["ms"] / one["ms"], 3)
    count, length = size["runner"]
    out["runner_batching_fast"] = runner(model, decoders["fast"], count, length, size["new"])
    decoders["fast"].fast.states.clear()  # the kept static caches
    if size.get("long"):  # one long prompt, batch 1, both paths (fewer steps: the prefill is long)
        long = {"prompt_tokens": size["long"]}
        for name, dec in decoders.items():
            row = step_ms(dec, 1, size["long"], 17, max(1, size["repeats"] - 1))
            row["x_floor"] = round(row["ms"] / 1e3 / floor, 2)
            long[name] = row
            print(f"  decode {name} after {size['long']} tokens: {row['ms']:.2f} ms/step")
        decoders["fast"].fast.states.clear()
        out["long_prompt"] = long
    out["targets"] = targets(out)
    print(f"  decode targets: {out['targets']}")
    return out


# --------------------------------------------------------------------------- logits


def scaled_init(model) -> None:
    """GPT-2's scaled initialisation of the residual branches' output projections and a x4 output
    head: see the module docstring."""
    import torch

    layers = model.config.num_hidden_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(1 / math.sqrt(2 * layers))
        model.lm_head.weight.mul_(4.0)


def compare(got: list, ref: list) -> dict:
    """Top-1 agreement and max |difference| of per-row logits against the reference's."""
    agree = [int(g.argmax()) == int(r.argmax()) for g, r in zip(got, ref, strict=True)]
    diff = max(float((g - r).abs().max()) for g, r in zip(got, ref, strict=True))
    return {"top1_agreement": sum(agree) / len(agree), "max_abs_diff": diff, "rows": len(agree)}


def decoders(model, tok, device) -> tuple[Decoder, Decoder]:
    """The plain loop's decoder and the fast path's (captured steps on CUDA)."""
    plain = Decoder.for_model(model, tok, decode="eager")
    return plain, Decoder.for_model(model, tok, decode="static", cuda_graphs=device.type == "cuda")


def ragbench_paths(model, plain, fast, reqs, prompts, questions, doc, record: int = 0):
    """Every ragbench path over the same ``prompts`` (``doc`` + each of ``questions``): a function
    per path that returns its rows (``Decoder.decode``'s dicts, ``_logits`` of the first
    ``record`` picks), and whether each should give the plain cache's numbers (``exact``).
    Paths: plain (one request at a time), batched (left padding), prefix reuse (copied and
    shared-prefix attention), the fast path (alone, batched, shared prefix) and every KV-cache
    variant (sinks with a window that holds the prompt; SnapKV keeping every position)."""
    import torch

    def run(dec, batch, suffixes, prefix=None, shared=False, kv=None):
        with torch.inference_mode():
            kv_prefix = dec.prefill(prefix)[0] if prefix else None
            plen = len(prefix) if prefix else 0
            return dec.decode(
                batch, suffixes, kv_prefix, plen, shared, 0, kv=kv, record_logits=record
            )

    def alone(dec, kv=None):
        return [run(dec, [r], [p], kv=kv)[0] for r, p in zip(reqs, prompts, strict=True)]

    paths = {
        "plain": lambda: alone(plain),
        "batched": lambda: run(plain, reqs, prompts),
        "prefix_reuse_copied": lambda: run(plain, reqs, questions, doc),
        "prefix_reuse_shared": lambda: run(plain, reqs, questions, doc, shared=True),
        "fast": lambda: alone(fast),
        "fast_batched": lambda: run(fast, reqs, prompts),
        "fast_prefix_shared": lambda: run(fast, reqs, questions, doc, shared=True),
    }
    exact = dict.fromkeys(paths, True)
    longest = max(len(p) for p in prompts)
    for label, spec, _ in kv_specs(longest):
        if spec is None or isinstance(spec, kv_cache.Plain):
            continue
        if isinstance(spec, kv_cache.Sinks):  # a window that holds the prompt: nothing evicted
            spec = kv_cache.Sinks(sink_tokens=4, window_tokens=longest + 8)
            label = spec.label()
        elif isinstance(spec, kv_cache.SnapKV):  # every position kept
            spec = kv_cache.SnapKV(ratio=1.0, window=spec.window)
            label = spec.label()
        key = f"kv_{label}"
        paths[key] = lambda spec=spec: (spec.check_model(model), alone(plain, kv=spec))[1]
        exact[key] = not isinstance(spec, kv_cache.Quantized)
    return paths, exact


PATH_ERRORS = (ImportError, ValueError, NotImplementedError, RuntimeError, TypeError)


def scaled_prompts(model, size: dict, seed: int, new: int, tag: str):
    """``scaled_init`` on ``model``, then a random document and ``size["q"]`` questions of about
    ``size["q_len"]`` ids (seeded from ``seed``): (document, questions, prompts, requests of
    ``new`` tokens)."""
    scaled_init(model)
    vocab = model.config.vocab_size
    doc = random_ids(size["doc"], vocab, seed)
    questions = [random_ids(size["q_len"] + i % 3, vocab, 100 * seed + i) for i in range(size["q"])]
    prompts = [doc + q for q in questions]
    reqs = [GenerationRequest(f"{tag}{i}", max_new_tokens=new) for i in range(len(prompts))]
    return doc, questions, prompts, reqs


def bench_logits(model, device, s: dict, tok) -> dict:
    """Every path's first two picks' logits against transformers' forward (module docstring);
    ``tok``: ``gpu_check.IdTokenizer()``."""
    import torch

    size = s["logits"]
    doc, questions, prompts, reqs = scaled_prompts(model, size, seed=3, new=2, tag="l")
    plain, fast = decoders(model, tok, device)

    def forward(ids: list[int]):
        x = torch.tensor([ids], device=device)
        return model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()

    with torch.inference_mode():
        ref0 = [forward(p) for p in prompts]
    margins = [float(r.topk(2).values[0] - r.topk(2).values[1]) for r in ref0]
    after: dict[tuple[int, int], object] = {}  # (row, first token) -> the next step's reference

    def ref_after(i: int, token: int):
        """The reference logits of the step after ``token``: each path's second pick is compared
        with the forward over its own first pick (after a differing first pick the two steps
        see different inputs, and their logits differ by far more than any rounding)."""
        if (i, token) not in after:
            with torch.inference_mode():
                after[i, token] = forward(prompts[i] + [token])
        return after[i, token]

    paths, exact = ragbench_paths(model, plain, fast, reqs, prompts, questions, doc, record=2)
    out: dict = {
        "rows": len(prompts),
        "document_tokens": len(doc),
        "init": "o_proj/down_proj x 1/sqrt(2 layers), lm_head x 4",
        "reference": "model(input_ids) per row, no cache, no padding; the second step after "
        "the path's own first pick",
        "reference_min_top1_margin": round(min(margins), 5),
        "paths": {},
    }
    picked: dict[str, list] = {}  # each path's first-pick logits
    for name, make in paths.items():
        try:
            rows = make()  # a KV variant: its check_model first (a package missing)
        except PATH_ERRORS as exc:
            out["paths"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"  logits {name}: {out['paths'][name]['error']}")
            continue
        firsts = [int(r["_logits"][0].argmax()) for r in rows]
        picked[name] = [r["_logits"][0] for r in rows]
        first = compare([r["_logits"][0] for r in rows], ref0)
        second = compare(
            [r["_logits"][1] for r in rows], [ref_after(i, t) for i, t in enumerate(firsts)]
        )
        same_first = [ids_of(r["text"])[:1] for r in rows] == [[int(r.argmax())] for r in ref0]
        diffs = [float((r["_logits"][0] - f).abs().max()) for r, f in zip(rows, ref0, strict=True)]
        flips = [i for i, t in enumerate(firsts) if t != int(ref0[i].argmax())]
        out["paths"][name] = {
            "exact": exact[name],
            "decode_path": rows[0]["meta"]["decode"].get("path"),
            "graph": rows[0]["meta"]["decode"].get("graph"),
            "first_token": first,
            "first_decode_step": second,
            "top1_agreement": min(first["top1_agreement"], second["top1_agreement"]),
            "max_abs_diff": max(first["max_abs_diff"], second["max_abs_diff"]),
            "same_first_token_as_reference": same_first,
            # each first pick that differs: the reference's top-1 margin there and the row's max
            # |difference| (a flip where the margin is within the difference is a near-tie)
            "first_token_flips": [
                {
                    "row": i,
                    "reference_margin": round(margins[i], 5),
                    "row_max_abs_diff": round(diffs[i], 5),
                }
                for i in flips
            ],
        }
        p = out["paths"][name]
        print(
            f"  logits {name}: top-1 {p['top1_agreement']:.3f}, max |diff| {p['max_abs_diff']:.3g}"
        )
    fast.fast.states.clear()  # before the weights move (a captured graph reads their storage)
    if model.dtype != torch.float32:  # the float32 truth: is each path as close as the reference?
        out["float32"] = float32_check(model, forward, prompts, ref0, picked)
    return out


def float32_check(model, forward, prompts, ref0, picked: dict[str, list]) -> dict:
    """The same weights in float32 (bf16 -> float32 -> bf16 is exact, so the parameters are
    restored bit for bit, in new storage; buffers such as RoPE's float32 ``inv_freq`` are not
    touched): the first pick's logits in float32, against which the reduced-precision reference
    and each path's first pick are scored. Differently fused kernels round differently; a path
    is as right as the reference when it is as close to float32."""
    import torch

    dtype = model.dtype
    params = list(model.parameters())
    with torch.no_grad():
        for p in params:
            p.data = p.data.float()
    try:
        with torch.inference_mode():
            truth = [forward(p) for p in prompts]
    finally:
        with torch.no_grad():
            for p in params:
                p.data = p.data.to(dtype)
    margins = [float(t.topk(2).values[0] - t.topk(2).values[1]) for t in truth]
    ref = compare(ref0, truth)
    paths = {name: compare(logits, truth) for name, logits in picked.items()}
    return {
        "min_top1_margin": round(min(margins), 5),
        "reference": ref,  # the reduced-precision reference against float32
        "paths": paths,  # each path's first pick against float32
        "worst_path_over_reference_diff": round(
            max(p["max_abs_diff"] for p in paths.values()) / max(ref["max_abs_diff"], 1e-9), 3
        ),
    }


# --------------------------------------------------------------------------- greedy32

# Llama-3.2-1B's published shape (config.json; untied head here, like the 8B builds)
LLAMA_1B = {
    "config": "LlamaConfig",
    "rope_theta": 500_000.0,
    "rms_norm_eps": 1e-5,
    "attention_bias": False,
    "shape": {
        "layers": 16,
        "hidden": 2048,
        "heads": 32,
        "kv_heads": 8,
        "intermediate_size": 8192,
        "vocab": 128_256,
    },
}


def bench_greedy32(model, device, s: dict, tok) -> dict:
    """Greedy token equality in float32: every ragbench path's generated ids against
    ``model.generate`` (one prompt at a time, no padding, no cache reuse), ``new`` tokens per
    prompt, on ``model`` (``LLAMA_1B`` in float32 on the device, ``scaled_init`` so the logits are
    not near-ties). In float32 the paths' kernels round far below the logits' margins, so every
    exact path must give the reference's tokens; a difference is a bug, not rounding."""
    size, new = s["greedy32"], s["greedy32"]["new"]
    doc, questions, prompts, reqs = scaled_prompts(model, size, seed=7, new=new, tag="g")
    ref = plain_generate(model, prompts, device, lambda: now(device), max_new_tokens=new)
    ref = ref["outputs"]
    plain, fast = decoders(model, tok, device)
    paths, exact = ragbench_paths(model, plain, fast, reqs, prompts, questions, doc)
    out: dict = {
        "dtype": str(model.dtype),
        "prompts": len(prompts),
        "document_tokens": len(doc),
        "new_tokens": new,
        "reference": "model.generate per prompt, greedy",
        "paths": {},
    }
    for name, make in paths.items():
        try:
            rows = make()
        except PATH_ERRORS as exc:
            out["paths"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"  greedy32 {name}: {out['paths'][name]['error']}")
            continue
        got = same([ids_of(r["text"]) for r in rows], ref)
        meta = rows[0]["meta"]["decode"]
        out["paths"][name] = {
            "exact": exact[name],
            "same_tokens": got,
            "decode_path": meta.get("path"),
            "graph": meta.get("graph"),
        }
        print(f"  greedy32 {name}: same tokens {got}")
    fast.fast.states.clear()
    ran = [p for p in out["paths"].values() if "error" not in p and p["exact"]]
    out["exact_paths_equal"] = bool(ran) and all(p["same_tokens"]["all"] for p in ran)
    return out
