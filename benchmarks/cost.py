"""Cost per query under batching: is a record charged the same batched as alone?

The same experiment (NIAH at 1k and 4k tokens; closed book, long context, RAG; SmolLM2 on this
machine, completion cache off) runs with ``model.batch_size: 1`` (every request alone) and ``8``
(rounds of 8 requests in one ``generate`` call: length buckets, shared prefixes, device time split
by stand-alone cost). Each arm runs ``--repeats`` times, alternating, and a record's resource
seconds is its median over the repeats: the machine is shared, and a busy moment must not pass
for an accounting error. Dollars come from the ``example-cpu-hour`` sheet, so they are resource
seconds times a constant.

Writes benchmarks/results/cost.json:

- ``batched_over_alone_spread``: max / min over records of (batched resource seconds / alone
  resource seconds); 1.0 = every record saves by the same factor. Target <= 1.3.
- ``closed_book_below_rag``: at batch size 8, mean dollars per query closed book < RAG < long
  context.
- ``per_strategy``: mean dollars and resource seconds per query in each arm, and the min / mean /
  max of the batched-over-alone ratio; ``per_record``: every record's numbers;
  ``spread_per_repeat``: the spread computed from single repeats (no median), for the noise.

Usage: ``python benchmarks/cost.py [--quick] [--repeats N] [--threads N] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragbench.experiment.config import load_config  # noqa: E402
from ragbench.experiment.resources import load_model  # noqa: E402
from ragbench.experiment.runner import run  # noqa: E402
from ragbench.io import atomic_write_text  # noqa: E402

STRATEGIES = ("closed_book", "long_context", "rag")


def config(out: str, lengths: list[int], depths: list[int], batch_size: int, tag: str) -> dict:
    return {
        "name": f"bench-cost-b{batch_size}-{tag}",
        "dataset": {
            "name": "niah",
            "params": {"context_lengths": lengths, "depth_percents": depths},
        },
        "model": {"backend": "hf", "cache": False, "batch_size": batch_size},
        "retrieval": {"embedder": "minilm"},
        "strategies": ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 3}}],
        "price_sheet": "example-cpu-hour",
        "output_dir": out,
    }


def column(df, name: str):
    return df[name] if name in df.columns else df[f"cost_{name}"]


def records(df) -> dict[tuple[str, str], dict]:
    out = {}
    for i in range(len(df)):
        out[(str(df["example_id"].iloc[i]), str(df["strategy"].iloc[i]))] = {
            "resource_seconds": float(column(df, "resource_seconds").iloc[i]),
            "dollars": float(column(df, "dollars").iloc[i]),
            "latency_seconds": float(column(df, "latency_seconds").iloc[i]),
            "prompt_tokens": int(column(df, "prompt_tokens").iloc[i]),
            "completion_tokens": int(column(df, "completion_tokens").iloc[i]),
            "padding_tokens": int(column(df, "padding_tokens").iloc[i]),
            "prediction": str(df["prediction"].iloc[i]),
        }
    return out


def warm_up(llm) -> None:
    """One call through each code path (plain batch, prefix + shared-prefix attention) so the
    first measured record does not pay one-time allocation and registration costs."""
    from ragbench.types import GenerationRequest

    doc = " ".join(["the quick brown fox jumps over the lazy dog."] * 60)
    llm.generate(
        [
            GenerationRequest(f"{doc} Who jumps?", prefix=doc, max_new_tokens=4),
            GenerationRequest("Who jumps?", max_new_tokens=4),
        ]  # fmt: skip
    )
    llm._prefix_kv.clear()  # no prefix from the warm-up stays cached for the arms


def spread(ratios: list[float]) -> float:
    return round(max(ratios) / min(ratios), 3)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k tokens, one depth, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each arm (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cost.json"))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    lengths, depths = ([1024], [50]) if args.quick else ([1024, 4096], [10, 50, 90])
    repeats = args.repeats or (1 if args.quick else 2)
    result: dict = {
        "context_lengths": lengths,
        "depth_percents": depths,
        "repeats": repeats,
        "threads": args.threads,
        "load_start": os.getloadavg(),
    }
    runs: dict[int, list[dict]] = {1: [], 8: []}
    with tempfile.TemporaryDirectory() as tmp:
        llm = load_model(load_config(config(tmp, lengths, depths, 1, "load")).model)  # one model
        t0 = time.perf_counter()
        llm.cost_rates()  # measured once (or read from the cache) before either arm
        result["calibration_seconds"] = round(time.perf_counter() - t0, 2)
        warm_up(llm)
        for rep in range(repeats):
            for batch in (1, 8):  # alternating: both arms see the same stretch of load
                t0 = time.perf_counter()
                df = run(config(tmp, lengths, depths, batch, str(rep)), progress=False, llm=llm)
                wall = round(time.perf_counter() - t0, 2)
                runs[batch].append(records(df))
                print(f"repeat {rep} batch_size {batch}: {wall} s", flush=True)
                result.setdefault(f"batch_{batch}_wall_seconds", []).append(wall)
    keys = sorted(runs[1][0])

    def median(batch: int, key, field: str) -> float:
        return statistics.median(r[key][field] for r in runs[batch])

    per_record = []
    for key in keys:
        alone, batched = median(1, key, "resource_seconds"), median(8, key, "resource_seconds")
        per_record.append(
            {
                "example_id": key[0],
                "strategy": key[1],
                "prompt_tokens": runs[8][0][key]["prompt_tokens"],
                "completion_tokens": [r[key]["completion_tokens"] for r in runs[8]],
                "completion_tokens_alone": [r[key]["completion_tokens"] for r in runs[1]],
                "padding_tokens": runs[8][0][key]["padding_tokens"],
                "alone_resource_seconds": round(alone, 4),
                "batched_resource_seconds": round(batched, 4),
                "batched_over_alone": round(batched / alone, 4),
                "alone_dollars": median(1, key, "dollars"),
                "batched_dollars": median(8, key, "dollars"),
                "batched_latency_seconds": round(median(8, key, "latency_seconds"), 4),
                "same_prediction": runs[1][0][key]["prediction"] == runs[8][0][key]["prediction"],
            }
        )
    ratios = [r["batched_over_alone"] for r in per_record]
    result["batched_over_alone_spread"] = spread(ratios)
    result["spread_per_repeat"] = [
        spread(
            [runs[8][i][k]["resource_seconds"] / runs[1][i][k]["resource_seconds"] for k in keys]
        )
        for i in range(repeats)
    ]
    per_strategy = {}
    for name in STRATEGIES:
        rows = [r for r in per_record if r["strategy"] == name]
        rs = [r["batched_over_alone"] for r in rows]
        per_strategy[name] = {
            "records": len(rows),
            "mean_prompt_tokens": round(statistics.mean(r["prompt_tokens"] for r in rows), 1),
            "alone_dollars_per_query": statistics.mean(r["alone_dollars"] for r in rows),
            "batched_dollars_per_query": statistics.mean(r["batched_dollars"] for r in rows),
            "alone_resource_seconds_per_query": round(
                statistics.mean(r["alone_resource_seconds"] for r in rows), 4
            ),
            "batched_resource_seconds_per_query": round(
                statistics.mean(r["batched_resource_seconds"] for r in rows), 4
            ),
            "batched_over_alone": {
                "min": min(rs),
                "mean": round(statistics.mean(rs), 4),
                "max": max(rs),
            },
        }
    result["per_strategy"] = per_strategy
    dollars = {k: v["batched_dollars_per_query"] for k, v in per_strategy.items()}
    result["closed_book_below_rag"] = bool(
        dollars["closed_book"] < dollars["rag"] < dollars["long_context"]
    )
    result["same_predictions"] = sum(r["same_prediction"] for r in per_record)
    result["records"] = len(per_record)
    result["per_record"] = per_record
    result["load_end"] = os.getloadavg()
    print(
        f"spread {result['batched_over_alone_spread']} (per repeat {result['spread_per_repeat']}); "
        f"closed book < RAG < long context: {result['closed_book_below_rag']}"
    )
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
