"""What a calibration costs: seconds to calibrate SmolLM2 on this CPU up to the lengths runs need.

Each arm runs in a fresh process on a fresh calibration cache (``RAGBENCH_CACHE``; the converted
weights are linked from the user's cache, so no arm pays the GGUF conversion), with ragbench from
a checkout (``--trees A,B``: two versions side by side, alternating, so both meet the same
stretch of load):

- ``8k``: a never-calibrated machine calibrating to 8,192 tokens (``ragbench compare`` on a
  corpus long context cuts to the window);
- ``2k+8k`` (where the checkout reuses probes): 2,048 tokens first (a RAG-only run), then 8,192
  (a run with long context): the seconds of the second step.

Per arm: seconds, the held-out validation error, the probes timed and the load average (start,
end, sampled mean), with the CPU model, its flags and the torch thread count. Writes
``benchmarks/results/calibration_cost.json``.

Usage: ``python benchmarks/calibration_cost.py [--trees PATH,...] [--rounds N] [--threads N]
[--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("RAGBENCH_TREE") or str(ROOT))

STEPS = {"8k": (8192,), "2k+8k": (2048, 8192)}


def child(steps: list[int], threads: int) -> dict:
    """Calibrate to each of ``steps`` in turn (this process, a fresh cache): their seconds."""
    import torch

    from ragbench.llm import calibration
    from ragbench.llm.hf.model import HFModel

    torch.set_num_threads(threads)
    llm = HFModel("smollm2-135m-instruct")
    out = []
    for longest in steps:
        t0 = time.perf_counter()
        rates = calibration.rates_for(llm.decoder, llm.weights, longest=longest)
        seconds = time.perf_counter() - t0
        meta = rates.meta or {}
        out.append(
            {
                "longest": longest,
                "seconds": round(seconds, 2),
                "validation_error": (meta.get("validation") or {}).get("error"),
                "probes_reused": len(meta.get("reused") or []),
                "probes": len(meta.get("probes") or {}),
            }
        )
    return {"steps": out}


def arm(name: str, tree: Path, threads: int, shared: Path) -> dict:
    """One arm in a fresh process and cache folder, ragbench from ``tree``."""
    from benchmarks.cost import LoadSampler

    with tempfile.TemporaryDirectory(prefix="bench-calib-") as tmp:
        cache = Path(tmp)
        for name_ in ("converted", "tokenizers", "assets"):  # no arm pays the conversion
            if (shared / name_).exists():
                (cache / name_).symlink_to(shared / name_, target_is_directory=True)
        env = {
            **os.environ,
            "RAGBENCH_CACHE": str(cache),
            "RAGBENCH_TREE": str(tree),
            "PYTHONPATH": str(tree),
        }
        steps = ",".join(map(str, STEPS[name]))
        with LoadSampler() as load:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", steps, str(threads)],
                env=env,
                cwd=tree,
                capture_output=True,
                text=True,
            )
    if proc.returncode:
        print(proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"error": proc.returncode}
    return {"arm": name, "tree": str(tree), **result, **load.summary()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=str(ROOT), help="checkouts, comma-separated")
    parser.add_argument("--arms", default="8k,2k+8k", help=f"of {list(STEPS)}")
    parser.add_argument("--rounds", type=int, default=1, help="times each arm runs per checkout")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/calibration_cost.json"))
    args = parser.parse_args(argv)
    from ragbench.assets import cache_dir
    from ragbench.devices import cpu_flags
    from ragbench.io import atomic_write_text
    from ragbench.llm.calibration import cpu_name

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    result: dict = {
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "threads": args.threads,
        "arms": [],
    }
    for _ in range(args.rounds):
        for name in args.arms.split(","):
            for tree in trees:  # alternating: every checkout meets the same stretch of load
                row = arm(name, tree, args.threads, cache_dir())
                result["arms"].append(row)
                print(json.dumps(row), flush=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # one arm's process: its steps, its thread count
        print(json.dumps(child([int(n) for n in sys.argv[2].split(",")], int(sys.argv[3]))))
        sys.exit(0)
    main()
