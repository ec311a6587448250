"""Runner batching on this machine: the same experiment with records generated one at a time
(``model.batch_size: 1``) and in rounds of 8 (the default), side by side in one run.

Writes benchmarks/results/runner.json: wall seconds of each, the ratio, and whether the two
result tables agree (predictions and scores per record). The completion cache is off so both
arms generate everything. Usage: ``python benchmarks/runner.py [--quick] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.runner import _load_llm, load_config, run  # noqa: E402


def config(out: str, lengths: list[int], batch_size: int) -> dict:
    return {
        "name": f"bench-runner-b{batch_size}",
        "dataset": {
            "name": "niah",
            "params": {"context_lengths": lengths, "depth_percents": [10, 50, 90]},
        },
        "model": {"backend": "hf", "cache": False, "batch_size": batch_size},
        "retrieval": {"embedder": "minilm"},
        "strategies": ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 3}}],
        "output_dir": out,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k-token haystacks only")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "runner.json"))
    args = parser.parse_args(argv)
    lengths = [1024] if args.quick else [1024, 2048]
    result: dict = {"context_lengths": lengths, "load_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        llm = _load_llm(load_config(config(tmp, lengths, 1)))  # one model for both arms
        tables = {}
        for batch in (1, 8):
            t0 = time.perf_counter()
            tables[batch] = run(config(tmp, lengths, batch), progress=False, llm=llm)
            result[f"batch_{batch}_seconds"] = round(time.perf_counter() - t0, 2)
            print(f"batch_size {batch}: {result[f'batch_{batch}_seconds']} s")
    cols = ["example_id", "strategy", "prediction", "string_match_all"]
    a, b = (tables[k][cols].reset_index(drop=True) for k in (1, 8))
    result["records"] = len(a)
    result["speedup"] = round(result["batch_1_seconds"] / result["batch_8_seconds"], 2)
    result["same_predictions"] = int((a["prediction"] == b["prediction"]).sum())
    result["same_scores"] = bool((a["string_match_all"] == b["string_match_all"]).all())
    result["load_end"] = os.getloadavg()
    print(f"speedup {result['speedup']}x; same predictions {result['same_predictions']}/{len(a)}")
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
