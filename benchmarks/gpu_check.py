"""GPU check: ragbench's LLM paths on real 7-8B architectures with random weights, one JSON.

Runs without model files or network: Llama-3.1-8B and Qwen2.5-7B are built from their published
shapes (``ragbench.models`` + the MLP widths below) with random weights, in bf16 on the
device, and fed token ids (no tokenizer). Per model:

- prefill tokens/s and MFU against a dense bf16 matmul peak measured in the same run (FLOPs from
  ``ragbench.cost.accounting.forward_flops``);
- prefix reuse: Q questions on one document: ragbench (the document's KV once, the questions
  batched over it through shared-prefix attention) against one plain ``generate`` per question and
  against prompt-cache reuse (``baselines.py``), with generated token-id equality;
- runner batching: independent prompts decoded one at a time against one batch;
- memory: measured KV bytes and ``torch.cuda.max_memory_allocated`` against
  ``ragbench.cost.accounting.kv_cache_bytes``;
- the cost model: ``ragbench.llm.calibration.measure`` probed to the longest length checked
  (32k), then long-context requests alone (a prefill of 1k/4k/16k/32k random tokens and 31
  decode steps through the ragbench decoder), each timed against what the calibrated model
  charges it (``modelled_over_measured``, goal within 15%), beside the fit the old probes (up to
  512-token prefills, 128 tokens after 2,048) give the same requests;
- every KV-cache variant ``ragbench.llm.kv.variants.KV_CACHES`` names (new ones are picked up;
  one that needs parameters this script does not know, or a missing package, is recorded as an
  error, not fatal);
- ``decode``: the bandwidth floor (weight bytes / measured copy bandwidth), ms per decode step at
  batch 1, 8, 32 on the plain loop and the fast path (static cache, CUDA graph), as multiples of
  the floor, runner batching of 8 short prompts on the fast path, a step after a 16k prompt on
  both, and issue 36's targets against them (``targets``, ``auto_ready``);
- ``logits``: every path's first two picks' logits against transformers' forward (top-1
  agreement, max |difference|), with an initialisation that keeps them off near-ties
  (``gpu_check_decode.py``).

Decoders here take ragbench's default decode path (``decode="auto"``: the plain loop until the
``decode`` part's ``targets`` hold; ``hf/static.py``); the ``decode``, ``logits`` and ``greedy32``
parts name theirs.

Random weights make greedy tokens near-ties, so in bf16 token equality between differently
fused kernels is reported, not required; ``--device cpu --quick`` (tiny configs, float32) is
where equality is exact and the test (tests/test_gpu_check.py) checks it.

Three parts run beside the models' (first, in this order; ``--parts`` picks any):

- ``tests``: the suite's CUDA tests, ``pytest -m gpu`` (a subprocess; its tail and counts);
- ``e2e``: one real ``ragbench run`` on the device (``gpu_check_e2e.py``): a random-weight
  Llama-3.1-8B shape saved with the embedded SmolLM2 tokenizer; NIAH at 4k and 16k; closed book,
  long context, BM25 RAG; the ``example-h100-hour`` sheet; it must finish on the device without
  errors, and its records say which device answered;
- ``greedy32``: greedy token equality in float32 at the Llama-3.2-1B shape: every ragbench path
  (plain, batched, prefix reuse, the fast path, the exact KV variants) against ``generate``.

Packages each part needs beyond torch and transformers (``PART_PACKAGES``: import names; a part
whose packages are missing is skipped with one line, and the JSON's ``packages`` says what was
found, with versions):

- the model parts (prefill, reuse, runner, kv, cost, decode, logits) and greedy32: none (PyYAML comes with
  transformers; ``psutil`` on CPU only). Imports: ``ragbench.types``, ``registry``, ``io``,
  ``cost`` + ``prices``, ``models``, ``llm.kv``, ``llm.shared_prefix``, ``llm.hf.decode``,
  ``llm.calibration``;
- ``tests``: pytest;
- ``e2e``: what ``ragbench run`` imports: pydantic, typer, PyYAML, pandas, pyarrow, numpy, scipy
  (calibration's fit), bm25s, llama-index-core (its splitters; + nltk, SQLAlchemy), tenacity,
  httpx, filelock, psutil, tqdm.

``packages_optional`` records the quantized KV cache's backends (hqq, optimum-quanto) for the
``kv`` and ``logits`` parts without skipping anything: without them those variants are recorded
with their ImportError, which names the package to install.

A lent machine's image lacks some of them (pydantic, bm25s, llama-index-core and its own
dependencies): ``benchmarks/gpu_carry.py`` downloads their wheels into ``gpu_carry/wheels`` here
(git-ignored, about 22 MiB) and ``gpu_check.sh`` installs them there (``--wheels``).
The JSON is rewritten (atomically) after each part of each model.
Usage: ``bash benchmarks/gpu_check.sh --out gpu.json [--quick] [--device cpu] [--parts ...]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import baselines  # noqa: E402  (benchmarks/baselines.py: torch + transformers only)
import gpu_check_decode  # noqa: E402
import gpu_check_e2e  # noqa: E402
import gpu_check_kv  # noqa: E402
from gpu_check_kv import ids_of, random_ids, same  # noqa: E402

from ragbench.cost.accounting import forward_flops, kv_cache_bytes  # noqa: E402
from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.llm import calibration, cost_model  # noqa: E402
from ragbench.llm.hf.decode import Decoder  # noqa: E402
from ragbench.llm.kv import variants as kv_cache  # noqa: E402
from ragbench.models import get_preset  # noqa: E402
from ragbench.types import GenerationRequest  # noqa: E402

# the presets' shapes + what the cost model does not need (from each published config.json)
ARCHS = {
    "llama-3.1-8b-instruct": {
        "config": "LlamaConfig",
        "intermediate_size": 14_336,
        "rope_theta": 500_000.0,
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
    },
    "qwen2.5-7b-instruct": {
        "config": "Qwen2Config",
        "intermediate_size": 18_944,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
    },
}
TINY = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "intermediate_size": 128,
    "vocab": 512,
}
# sizes: (prefill lengths, document, questions, question tokens, new tokens, prompts x length)
FULL = {"prefill": [1024, 4096, 16384], "doc": 8192, "q": 16, "q_len": 24, "new": 32}
FULL |= {"runner": (8, 2048), "cost": [1024, 4096, 16384, 32768]}
QUICK = {"prefill": [64, 128], "doc": 96, "q": 4, "q_len": 6, "new": 6, "runner": (3, 32)}
QUICK |= {"cost": [32, 64, 128]}
# decode: a short prompt, 32 decode steps, best of 3; runner batching of 8 short prompts on the
# fast path; one long prompt on both paths. logits: a document and questions (gpu_check_decode.py)
FULL |= {
    "decode": {
        "copy_bytes": 1 << 30,
        "prompt": 128,
        "new": 33,
        "repeats": 3,
        "batches": [1, 8, 32],
        "runner": (8, 128),
        "long": 16384,
    },
    "logits": {"doc": 1024, "q": 8, "q_len": 16},
    "greedy32": {"doc": 512, "q": 4, "q_len": 16, "new": 12},
}
QUICK |= {
    "decode": {
        "copy_bytes": 1 << 24,
        "prompt": 16,
        "new": 5,
        "repeats": 1,
        "batches": [1, 8, 32],
        "runner": (3, 16),
        "long": 96,
    },
    "logits": {"doc": 48, "q": 4, "q_len": 6},
    "greedy32": {"doc": 40, "q": 3, "q_len": 6, "new": 6},
}
# the probes of calibration version 2 (before it probed the run's lengths), for the comparison
OLD_PREFILL = ((16, 0), (128, 0), (512, 0), (128, 2048))
OLD_DECODE = ((16, 1), (1024, 1), (4096, 1), (16, 4))


class IdTokenizer:
    """What ``Decoder`` needs of a tokenizer when prompts are token ids: the decoded "text" is the
    ids, space-separated, so outputs compare as token ids. No EOS: every row runs to
    ``max_new_tokens``, like ``generate`` with ``eos_token_id=None``."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def build_model(name: str, device, dtype, quick: bool, arch: dict | None = None):
    """A random-weight model of ``ARCHS[name]`` (or ``arch``, whose ``shape`` is given) on the
    device, and its facts; ``quick``: the ``TINY`` shape."""
    import torch
    import transformers

    arch = arch or ARCHS[name]
    if "shape" in arch:
        shape, window = arch["shape"], 32_768
    else:
        p = get_preset(name)
        shape, window = (
            {**vars(p), "intermediate_size": arch["intermediate_size"]},
            p.context_window,
        )
    shape = TINY if quick else shape
    head_dim = shape["hidden"] // shape["heads"]
    kwargs = {k: arch[k] for k in ("rope_theta", "rms_norm_eps", "attention_bias") if k in arch}
    config = getattr(transformers, arch["config"])(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=head_dim,
        max_position_embeddings=max(window, 32_768),
        tie_word_embeddings=False,
        **kwargs,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # weights created (randomly initialised) on the device
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:  # transformers < 4.56 calls it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    n_embed = model.get_input_embeddings().weight.numel() + model.lm_head.weight.numel()
    total = sum(t.numel() for t in model.parameters())
    facts = {
        "non_embedding_params": total - n_embed,
        "layers": shape["layers"],
        "heads": shape["heads"],
        "kv_heads": shape["kv_heads"],
        "head_dim": head_dim,
        "params": total,
        "weight_bytes": sum(t.numel() * t.element_size() for t in model.parameters()),
        "config": arch["config"],
    }
    return model, facts


def matmul_peak(hidden: int, width: int, device, dtype, tokens: int = 4096) -> dict:
    import torch

    best = {}
    for m, k, n in [(tokens, hidden, width), (tokens, width, hidden), (tokens, hidden, hidden)]:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        torch.matmul(a, b)
        times = []
        for _ in range(5):
            t0 = now(device)
            torch.matmul(a, b)
            times.append(now(device) - t0)
        best[f"{m}x{k}x{n}"] = 2.0 * m * k * n / min(times)
    return {"peak_flops": max(best.values()), "by_shape": best, "dtype": str(dtype)}


def now(device) -> float:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def bench_prefill(model, facts, dec: Decoder, sizes: list[int], peak: float) -> list[dict]:
    import torch

    rows = []
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for n in sizes:
            ids = random_ids(n, vocab, n)
            dec.prefill(ids)  # warm-up (kernels, allocator)
            seconds = min(dec.prefill(ids)[1] for _ in range(2))
            flops = forward_flops(facts, n, 0, 1)["total"]
            rows.append(
                {
                    "tokens": n,
                    "seconds": round(seconds, 5),
                    "tokens_per_second": round(n / seconds, 1),
                    "mfu": round(flops / seconds / peak, 4),
                }
            )
            print(f"  prefill {n:>6}: {n / seconds:10.0f} tok/s, MFU {rows[-1]['mfu']:.1%}")
    return rows


def ragbench_reuse(dec: Decoder, doc: list[int], questions: list[list[int]], new: int) -> dict:
    """Document KV once (batch of one), all questions in one batch over it (shared prefix)."""
    import torch

    reqs = [GenerationRequest(f"q{i}", max_new_tokens=new) for i in range(len(questions))]
    with torch.inference_mode():
        t0 = dec.now()
        kv, prefill_s = dec.prefill(doc)
        rows = dec.decode(reqs, questions, kv, len(doc), shared=True, seed=0)
        seconds = dec.now() - t0
    return {
        "outputs": [ids_of(r["text"]) for r in rows],
        "seconds": seconds,
        "prefill_seconds": prefill_s,
        "after_prefill_seconds": seconds - prefill_s,
        "kv_bytes_measured_row": rows[0]["kv_bytes_measured"],
        "peak_memory_bytes": rows[0]["peak_memory_bytes"],
    }


def bench_reuse(model, facts, dec: Decoder, s: dict) -> dict:
    vocab, q = model.config.vocab_size, s["q"]
    doc = random_ids(s["doc"], vocab, 1)
    questions = [random_ids(s["q_len"], vocab, 100 + i) for i in range(q)]
    prompts = [doc + x for x in questions]
    gen = {"max_new_tokens": s["new"], "min_new_tokens": s["new"], "eos_token_id": None}
    gen["pad_token_id"] = 0
    dev, clock = dec.device, dec.now
    ours = ragbench_reuse(dec, doc, questions, s["new"])  # warm-up: kernels and allocator
    ours = ragbench_reuse(dec, doc, questions, s["new"])
    reuse = baselines.prompt_cache_reuse(model, prompts, len(doc), dev, clock, **gen)
    plain = baselines.plain_generate(model, prompts, dev, clock, **gen)
    positions = len(doc) + s["q_len"] + s["new"] - 1
    out = {
        "document_tokens": len(doc),
        "questions": q,
        "question_tokens": s["q_len"],
        "new_tokens": s["new"],
        "ragbench_seconds": round(ours["seconds"], 4),
        "ragbench_prefill_seconds": round(ours["prefill_seconds"], 4),
        "prompt_cache_reuse_seconds": round(reuse["seconds"], 4),
        "plain_generate_seconds": round(plain["seconds"], 4),
        "speedup_vs_plain_generate": round(plain["seconds"] / ours["seconds"], 2),
        "speedup_vs_prompt_cache_reuse": round(reuse["seconds"] / ours["seconds"], 2),
        "marginal_speedup_vs_prompt_cache_reuse": round(
            reuse["after_prefill_seconds"] / ours["after_prefill_seconds"], 2
        ),
        "same_tokens_as_plain_generate": same(ours["outputs"], plain["outputs"]),
        "same_tokens_as_prompt_cache_reuse": same(ours["outputs"], reuse["outputs"]),
        "baselines_agree": same(reuse["outputs"], plain["outputs"]),
        # ragbench's batch: one shared document KV + each row's own question and answer
        "kv_bytes_measured_row": ours["kv_bytes_measured_row"],
        "kv_bytes_formula_document": kv_cache_bytes(
            facts["layers"], facts["kv_heads"], facts["head_dim"], len(doc), 1, model.dtype.itemsize
        ),
        "kv_bytes_formula_copies": kv_cache_bytes(
            facts["layers"],
            facts["kv_heads"],
            facts["head_dim"],
            positions,
            q,
            model.dtype.itemsize,
        ),
        "peak_memory_bytes": ours["peak_memory_bytes"],
    }
    print(
        f"  prefix reuse: ragbench {ours['seconds']:.2f} s, prompt-cache reuse "
        f"{reuse['seconds']:.2f} s, plain generate {plain['seconds']:.2f} s; same tokens "
        f"{out['same_tokens_as_plain_generate']['rows_identical']}/{q}"
    )
    return out


def bench_runner(model, dec: Decoder, count: int, length: int, new: int) -> dict:
    """Independent prompts (the runner's batch of records): one at a time vs one batch."""
    import torch

    vocab = model.config.vocab_size
    prompts = [random_ids(length, vocab, 500 + i) for i in range(count)]
    reqs = [GenerationRequest(f"r{i}", max_new_tokens=new) for i in range(count)]
    with torch.inference_mode():  # warm-up of both shapes (kernels; the fast path's captures)
        dec.decode(reqs[:1], prompts[:1], None, 0, shared=False, seed=0)
        dec.decode(reqs, prompts, None, 0, shared=False, seed=0)
        t0 = dec.now()
        alone = [
            dec.decode([r], [p], None, 0, False, 0)[0] for r, p in zip(reqs, prompts, strict=True)
        ]
        t1 = dec.now()
        batched = dec.decode(reqs, prompts, None, 0, shared=False, seed=0)
        t2 = dec.now()
    out = {
        "prompts": count,
        "prompt_tokens": length,
        "one_at_a_time_seconds": round(t1 - t0, 4),
        "batched_seconds": round(t2 - t1, 4),
        "speedup": round((t1 - t0) / (t2 - t1), 2),
        "same_tokens": same(
            [ids_of(r["text"]) for r in batched], [ids_of(r["text"]) for r in alone]
        ),
    }
    print(f"  runner batching: {out['speedup']}x")
    return out


def bench_cost_model(model, dec: Decoder, lengths: list[int], new: int) -> dict:
    """Calibrated (modelled) against measured device seconds of long-context requests alone."""
    import torch

    t0 = time.perf_counter()
    rates = calibration.measure(dec, longest=max(lengths), rounds=2)
    seconds = time.perf_counter() - t0
    gen, kv = torch.Generator().manual_seed(0), {}
    with torch.inference_mode():  # the old probe set on the same device, fitted the new way
        old_prefill = [
            (n, p, calibration._forward(dec, gen, kv, n, p, 1, False)) for n, p in OLD_PREFILL
        ]
        old_decode = [
            (k, r, calibration._forward(dec, gen, kv, 1, k - 1, r, False)) for k, r in OLD_DECODE
        ]
    kv.clear()
    old = cost_model.fit(old_prefill, old_decode)
    rows, vocab = [], model.config.vocab_size
    with torch.inference_mode():
        for n in lengths:  # warm-up at every length: kernels and allocator blocks per shape
            warm = random_ids(n, vocab, 7 + n)
            dec.decode([GenerationRequest("w", max_new_tokens=2)], [warm], None, 0, False, 0)
        for n in lengths:
            prompt = random_ids(n, vocab, 900 + n)
            req = GenerationRequest(f"lc{n}", max_new_tokens=new)
            runs = []
            for _ in range(3):
                t1 = dec.now()
                out = dec.decode([req], [prompt], None, 0, False, 0)[0]
                runs.append((dec.now() - t1, out["prefill_seconds"], out["decode_seconds"]))
            best, prefill_s, decode_s = min(runs)
            made = len(ids_of(out["text"]))
            modelled, before = rates.alone(n, made), old.alone(n, made)
            rows.append(
                {
                    "prompt_tokens": n,
                    "completion_tokens": made,
                    "measured_seconds": round(best, 5),
                    "modelled_seconds": round(modelled, 5),
                    "measured_runs": [round(r[0], 5) for r in runs],
                    "measured_prefill_seconds": round(prefill_s, 5),
                    "measured_decode_seconds": round(decode_s, 5),
                    "modelled_prefill_seconds": round(rates.forward(n), 5),
                    "modelled_decode_seconds": round(rates.decode(made - 1, n + 1), 5),
                    "modelled_over_measured": round(modelled / best, 4),
                    "old_probes_modelled_over_measured": round(before / best, 4),
                }
            )
            print(
                f"  cost model {n:>6} tokens: modelled/measured {rows[-1]['modelled_over_measured']}"
                f" (old probes {rows[-1]['old_probes_modelled_over_measured']}); runs "
                f"{rows[-1]['measured_runs']}"
            )
    worst = max(abs(r["modelled_over_measured"] - 1) for r in rows)
    numbers = {k: v for k, v in rates.to_dict().items() if k != "meta"}
    return {
        "calibration_seconds": round(seconds, 2),
        "rates": numbers,
        "validation": rates.meta.get("validation"),
        "long_context": rows,
        "probes": rates.meta.get("probes"),
        "old_probes": {"prefill": old_prefill, "decode": old_decode},
        "worst_relative_error": round(worst, 4),
        "within_15_percent": worst <= 0.15,
        "old_rates": {k: v for k, v in old.to_dict().items() if k != "meta"},
    }


# decode before cost: issue 36 first under the hard stop; logits last (it rescales the weights)
MODEL_PARTS = ("prefill", "reuse", "runner", "kv", "decode", "cost", "logits")
PARTS = ("tests", "e2e", "greedy32", *MODEL_PARTS)  # run in this order
# import names each part needs beyond torch and transformers (their pip names: the docstring)
PART_PACKAGES: dict[str, tuple[str, ...]] = {
    "tests": ("pytest",),
    "e2e": (
        "pydantic",
        "typer",
        "yaml",
        "pandas",
        "pyarrow",
        "numpy",
        "bm25s",
        "llama_index.core",
        "nltk",
        "sqlalchemy",
        "scipy",
        "tenacity",
        "httpx",
        "filelock",
        "psutil",
        "tqdm",
    ),
} | dict.fromkeys(("greedy32", *MODEL_PARTS), ())
# probed and recorded, never skipping a part: the quantized KV cache's backends (without them its
# variants are recorded with their ImportError, which names the package to install)
OPTIONAL_PACKAGES: dict[str, tuple[str, ...]] = {
    "kv": ("hqq", "optimum.quanto"),
    "logits": ("hqq", "optimum.quanto"),
}


def probe(modules: tuple[str, ...]) -> dict:
    """Each module found or not, with its distribution's version where known; nothing imported
    (``find_spec`` of a dotted name imports its parent package only)."""
    out = {}
    for mod in modules:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        version = None
        if found:
            dists = importlib.metadata.packages_distributions().get(mod.split(".")[0], [])
            for dist in dists:
                try:
                    version = importlib.metadata.version(dist)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
        out[mod] = version if found and version else ("found" if found else None)
    return out


def run_tests(device, timeout: float = 240) -> dict:
    """The suite's CUDA tests (``pytest -m gpu``) in a subprocess: exit code, counts, tail."""
    # only the files that hold CUDA tests: collecting the rest would import packages a lent
    # machine lacks (a collection error stops the whole session)
    files = sorted(
        str(f)
        for f in (ROOT / "tests").glob("test_*.py")
        if "mark.gpu" in f.read_text(encoding="utf-8")
    )
    if not files:
        return {"error": "no test file under tests/ has a gpu-marked test"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=-ra",
        *files,
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"pytest -m gpu passed {timeout} s", "seconds": timeout}
    tail = (proc.stdout + proc.stderr)[-4000:]
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) ([a-z]+)", summary)}
    print(f"  pytest -m gpu: {summary}")
    return {
        "returncode": proc.returncode,
        "summary": summary,
        "counts": counts,
        "files": files,
        "seconds": round(time.perf_counter() - t0, 1),
        "tail": tail,
        "ok": proc.returncode == 0 and counts.get("passed", 0) > 0,
    }


def check_model(name: str, device, dtype, s: dict, quick: bool, parts=PARTS, save=None) -> dict:
    """One architecture's ``parts``; ``save(out)`` after each (the caller rewrites the JSON)."""
    import torch

    save = save or (lambda out: None)
    t0 = time.perf_counter()
    model, facts = build_model(name, device, dtype, quick)
    dec = Decoder.for_model(model, IdTokenizer())
    built = time.perf_counter() - t0
    print(f"{name}: {facts['params'] / 1e9:.2f} B params built in {built:.1f} s")
    width = model.config.intermediate_size
    peak = matmul_peak(model.config.hidden_size, width, device, dtype)
    out = {"arch": facts, "build_seconds": round(built, 2), "matmul_peak": peak}
    keys = {
        "prefill": "prefill",
        "reuse": "prefix_reuse",
        "runner": "runner_batching",
        "kv": "kv_variants",
        "cost": "cost_model",
        "decode": "decode",
        "logits": "logits",
    }
    for part in [p for p in MODEL_PARTS if p in parts]:  # logits last: it rescales the weights
        try:
            if part == "prefill":
                got = bench_prefill(model, facts, dec, s["prefill"], peak["peak_flops"])
            elif part == "reuse":
                got = bench_reuse(model, facts, dec, s)
            elif part == "runner":
                got = bench_runner(model, dec, *s["runner"], s["new"])
            elif part == "kv":
                got = gpu_check_kv.bench_kv(model, facts, dec, s["doc"], s["new"])
            elif part == "cost":
                got = bench_cost_model(model, dec, s["cost"], s["new"])
            elif part == "decode":
                got = gpu_check_decode.bench_decode(
                    model, facts, torch.device(device), s, IdTokenizer(), bench_runner
                )
            else:  # logits (gpu_check_decode.scaled_init)
                got = gpu_check_decode.bench_logits(model, torch.device(device), s, IdTokenizer())
        except Exception as exc:  # recorded; the other parts' results stand
            got = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(f"  {part}: {got['error']}")
        out[keys[part]] = got
        save(out)
    if torch.device(device).type == "cuda":
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    del model, dec
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


def greedy32(device, s: dict, quick: bool) -> dict:
    """The ``greedy32`` part (``gpu_check_decode.bench_greedy32``) on its own float32 model."""
    import torch

    try:
        model, facts = build_model(
            "llama-3.2-1b", device, torch.float32, quick, gpu_check_decode.LLAMA_1B
        )
        out = {"arch": facts} | gpu_check_decode.bench_greedy32(model, device, s, IdTokenizer())
    except Exception as exc:  # recorded; the other parts run
        out = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(f"  greedy32: {out['error']}")
    model = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, float32 on CPU")
    parser.add_argument("--quick", action="store_true", help="tiny configs and sizes")
    parser.add_argument("--models", default=",".join(ARCHS), help=f"from {list(ARCHS)}")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"from {list(PARTS)}")
    parser.add_argument("--e2e-timeout", type=float, default=300, help="seconds for ragbench run")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"unknown part(s) {unknown}; choose from {list(PARTS)}")
    import torch
    import transformers

    device = torch.device(args.device)
    auto = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto if args.dtype == "auto" else getattr(torch, args.dtype)
    s = QUICK if args.quick else FULL
    started = time.perf_counter()
    packages = {part: probe(PART_PACKAGES[part]) for part in parts}
    result: dict = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "quick": args.quick,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "kv_caches": list(kv_cache.KV_CACHES),
        "sizes": s,
        "parts": parts,
        "packages": packages,
        "packages_optional": {
            p: probe(OPTIONAL_PACKAGES[p]) for p in parts if p in OPTIONAL_PACKAGES
        },
        "skipped": {},
        "models": {},
    }

    def save() -> None:
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        atomic_write_text(args.out, json.dumps(result, indent=2, sort_keys=True) + "\n")

    for part in parts:  # a part whose packages are missing: one line, no traceback
        if missing := [m for m, v in packages[part].items() if v is None]:
            result["skipped"][part] = f"missing {', '.join(missing)}"
            print(f"{part}: skipped, missing {', '.join(missing)} (see gpu_check.sh --wheels)")
    if "tests" in parts and "tests" not in result["skipped"]:
        print("tests: pytest -m gpu")
        result["tests"] = run_tests(device)
        save()
    if "e2e" in parts and "e2e" not in result["skipped"]:
        print("e2e: ragbench run")
        result["e2e"] = gpu_check_e2e.run_e2e(
            str(device), shape="tiny" if args.quick else None, timeout=args.e2e_timeout
        )
        print(
            f"  e2e: ok {result['e2e'].get('ok')}, records {result['e2e'].get('records')}, "
            f"devices {result['e2e'].get('devices')}, {result['e2e'].get('error', '')}"
        )
        save()
    if "greedy32" in parts:
        print("greedy32: Llama-3.2-1B shape in float32")
        result["greedy32"] = greedy32(device, s, args.quick)
        save()
    model_parts = [p for p in parts if p in MODEL_PARTS]
    for name in [m for m in args.models.split(",") if m] if model_parts else []:

        def partial(out: dict, name=name) -> None:
            result["models"][name] = out
            save()

        try:
            result["models"][name] = check_model(
                name, device, dtype, s, args.quick, model_parts, partial
            )
        except Exception as exc:  # one architecture failing leaves the other's results
            result["models"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(f"{name}: {result['models'][name]['error']}")
        save()
    save()
    print(f"wrote {args.out} in {result['wall_seconds']} s")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
