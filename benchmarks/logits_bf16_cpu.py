"""The ``logits`` part of ``gpu_check.py`` on the CPU in bfloat16, at a size between the quick
shape and the 8B ones: did ragbench's batched and prefix-reuse paths disagree with transformers'
forward in bf16 on the H200 because of a bug, or because differently fused kernels round
differently? A random-weight Llama (``LAYERS`` x ``HIDDEN``, head dim 64, vocabulary 16,384, the
same scaled initialisation: residual projections x 1/sqrt(2 layers), output head x 4), a
``DOC``-token document with 8 questions; every path's first two picks against the reference, and
the reference and each path against the same weights in float32 (``gpu_check_decode.py``).

    python benchmarks/logits_bf16_cpu.py 32 256 1024   # the H200's depth and document, ~10 min
    python benchmarks/logits_bf16_cpu.py 8 512 512     # ~2.5 min

Writes ``benchmarks/results/logits_bf16_cpu.json`` (one entry per shape, merged).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import gpu_check  # noqa: E402
import gpu_check_decode  # noqa: E402


def main(layers: int, hidden: int, doc: int, threads: int = 1) -> dict:
    import torch
    import transformers

    torch.set_num_threads(threads)
    config = transformers.LlamaConfig(
        vocab_size=16_384,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=500_000.0,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    t0 = time.perf_counter()
    sizes = {"logits": {"doc": doc, "q": 8, "q_len": 16}}
    out = gpu_check_decode.bench_logits(model, torch.device("cpu"), sizes, gpu_check.IdTokenizer())
    out |= {
        "seconds": round(time.perf_counter() - t0, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": threads,
    }
    path = ROOT / "benchmarks" / "results" / "logits_bf16_cpu.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    done[f"llama-{layers}x{hidden}-doc{doc}-bf16"] = out
    path.write_text(json.dumps(done, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out["float32"]["reference"]), out["float32"]["worst_path_over_reference_diff"])
    return out


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
