"""One run, local vs sharded over Ray with 2 workers, on this machine: the same config twice.

- fake model: a 2,000-example NIAH run (``long_context``, rounds of 8), the fake backend with
  ``sleep: true`` (each call waits its simulated prefill and decode time: a model that takes time
  without using the CPU, so two workers can run side by side on a loaded 2-core machine);
- embedded model: SmolLM2 (transformers, CPU) on a smaller NIAH run (``--embedded-examples``,
  200 by default), one torch thread per process: local on one core vs 2 Ray workers on one core
  each (the scale-out being measured). The model's cost calibration is measured (or read) once
  before the timed runs: neither arm pays it.

Per arm: wall seconds of ``run()``, ``ray_speedup`` = local / Ray (Ray already started, as on a
cluster; ``ray_init_seconds`` apart, and ``ray_speedup_with_init`` counting it), whether the
records are identical (ids, predictions, scores, token counts, dollars: what must not depend on the
executor; measured wall times are left out), and ``overhead_ms_per_item`` = (Ray wall - local
wall / workers) / items: what sharding costs per work item beyond a perfect split (worker start and
model load included). Both arms include a run's serial parts (building the dataset, writing
the table), which bound the speedup. Completion caches off: every arm generates everything.
Records the CPU model, flags and load average before and after.

Writes benchmarks/results/scale.json. Usage: ``python benchmarks/scale.py [--quick]
[--fake-examples N] [--embedded-examples N] [--skip-embedded] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
# no script in this folder may shadow a standard module (Ray imports http); kept as a guard
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

from ragbench.devices import cpu_flags  # noqa: E402
from ragbench.experiment.results import RECORDS, read_records  # noqa: E402
from ragbench.experiment.runner import run  # noqa: E402
from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.llm.calibration import cpu_name  # noqa: E402

WORKERS = 2
FAKE_RATES = {"prefill_tokens_per_second": 4000, "decode_tokens_per_second": 1000}


def niah(examples: int, lengths: list[int]) -> dict:
    """NIAH parameters giving ``examples`` examples: the lengths x enough depths."""
    depths = -(-examples // len(lengths))
    return {
        "name": "niah",
        "params": {
            "context_lengths": lengths,
            "depth_percents": [round(100 * (i + 0.5) / depths, 4) for i in range(depths)],
            "tokenizer": "whitespace",
        },
        "limit": examples,
    }


def fake_config(out: str, examples: int) -> dict:
    # ~150-token prompts, 8 per round: ~0.3 s of simulated time per round (the fake's default
    # rates, SmolLM2 on a laptop CPU, would make this run half an hour)
    params = {"sleep": True, **FAKE_RATES}
    return {
        "name": "scale-fake",
        "dataset": niah(examples, [300, 400, 500]),
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
            "batch_size": 8,
            "params": params,
        },
        "strategies": ["long_context"],
        "output_dir": out,
    }


def embedded_config(out: str, examples: int) -> dict:
    return {
        "name": "scale-embedded",
        "dataset": niah(examples, [300, 400]),
        "model": {
            "backend": "hf",
            "cache": False,
            "batch_size": 4,
            "threads": 1,
            "max_new_tokens": 32,
        },
        "strategies": ["long_context"],
        "output_dir": out,
    }


def same_fields(record) -> dict:
    cost = record.cost.to_dict() if record.cost is not None else {}
    tokens = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "dollars")
    return {
        "id": (record.example_id, record.strategy, record.params.to_dict()),
        "prediction": record.prediction,
        "scores": record.scores,
        "error": record.error,
        **{k: cost.get(k) for k in tokens},
    }


def compare(make, examples: int) -> dict:
    """``make(out_dir)`` -> config; local vs Ray with ``WORKERS`` workers."""
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        local = run(make(f"{tmp}/local"), progress=False)
        local_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.init(
            num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, logging_level="ERROR"
        )
        init_s = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            sharded = run(make(f"{tmp}/ray"), progress=False, executor="ray", workers=WORKERS)
            ray_s = time.perf_counter() - t0
        finally:
            ray.shutdown()
        a = read_records(Path(local.attrs["run_dir"]) / RECORDS)
        b = read_records(Path(sharded.attrs["run_dir"]) / RECORDS)
        differing: dict[str, int] = {}  # field -> records where the two runs differ
        for k in a.keys() & b.keys():
            fa, fb = same_fields(a[k]), same_fields(b[k])
            for name in fa:
                differing[name] = differing.get(name, 0) + (fa[name] != fb[name])
        identical = a.keys() == b.keys() and not any(differing.values())
        manifest = json.loads((Path(sharded.attrs["run_dir"]) / "manifest.json").read_text())
        executor = manifest["sessions"][-1]["executor"]
        shards = executor["shards"]
        n = len(local)
        return {
            "examples": examples,
            "items": n,
            "workers": WORKERS,
            "local_seconds": round(local_s, 2),
            "ray_seconds": round(ray_s, 2),
            "ray_init_seconds": round(init_s, 2),
            "workers_start_seconds": executor["start_seconds"],  # in ray_seconds: model loads
            "ray_speedup": round(local_s / ray_s, 3),
            "ray_speedup_with_init": round(local_s / (ray_s + init_s), 3),
            "identical_records": bool(identical),
            "differing_fields": {k: v for k, v in differing.items() if v},
            "overhead_ms_per_item": round(1000 * (ray_s - local_s / WORKERS) / n, 3),
            "shards": len(shards),
            "items_per_worker": [
                sum(s["items"] for s in shards if s["worker"] == w) for w in range(WORKERS)
            ],
            "errors": int(local["error"].notna().sum() + sharded["error"].notna().sum()),
        }


def calibrate(cfg: dict) -> None:
    """The model's cost calibration at 1 thread, measured now if not cached (both arms read it)."""
    from ragbench.experiment.config.run import load_config
    from ragbench.experiment.resources import load_model, rates_of

    rates_of(load_model(load_config(cfg).model))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 fake, 20 embedded examples")
    parser.add_argument("--fake-examples", type=int, default=2000)
    parser.add_argument("--embedded-examples", type=int, default=200)
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scale.json")
    args = parser.parse_args(argv)
    fake_n = 200 if args.quick else args.fake_examples
    emb_n = 20 if args.quick else args.embedded_examples
    result: dict = {
        "benchmark": "scale",
        "what": "one run, local vs Ray with 2 workers (benchmarks/scale.py docstring)",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_model": cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    result["fake"] = compare(lambda out: fake_config(out, fake_n), fake_n)
    result["fake"]["simulated_rates"] = FAKE_RATES  # the fake model sleeps what these give
    print(json.dumps(result["fake"]), flush=True)
    if not args.skip_embedded:
        make = lambda out: embedded_config(out, emb_n)  # noqa: E731
        calibrate(make("/tmp/unused"))
        result["embedded"] = compare(make, emb_n)
        if emb_n < 200:
            result["embedded"]["note"] = f"{emb_n} examples, not 200 (--embedded-examples)"
        print(json.dumps(result["embedded"]), flush=True)
    result["load_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
