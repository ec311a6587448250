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

``cost_reproducibility`` (``--only-reproducibility`` runs just it and adds it to ``--out``): does a
config cost the same on a quiet and on a busy machine? The same config (closed book, long
context, RAG on NIAH; SmolLM2, completion cache off) runs once alone and once with a CPU-bound
process beside it (numpy matmuls on one core), under the default ``cost_basis: calibrated``, then
the same pair under ``cost_basis: measured``: ``calibrated_ratio`` and ``measured_ratio`` (max / min
of the two runs' mean dollars per query; target <= 1.05 calibrated), each run's load average
(at start, end, and the mean of the 1-minute figure sampled during the run), wall seconds, mean
resource and modelled seconds, and the calibration used (measured once, before the runs).

``calibrated_vs_measured`` (``--only-calibration`` runs just it and adds it to ``--out``): is the
calibrated cost model the device time it stands for, at the lengths a run uses and the load it
meets? NIAH at 1k, 4k and 7k tokens (depths 10/50/90%), closed book, long context and RAG, every
request alone (``batch_size: 1``, so a record's measured resource seconds are its own device
time), under a calibration measured at the start of the section (its own cache folder, at the
machine's load of the moment, probed to the run's longest prompt; its seconds and load are
recorded). Each cell is run again (same examples, a new run folder) until its measured mean's
95% interval is within +-5% (at most 8 repeats; closed book's 58-token prompts vary the most).
Per strategy and length: records, mean modelled / mean measured seconds (goal within 10%), the
interval, and the ratio had every prefill probe stood for the median of its samples rather than
its fastest, with the CPU model, its flags and the load average.

Usage: ``python benchmarks/cost.py [--quick] [--repeats N] [--threads N] [--out PATH]
[--only-reproducibility] [--repro-threads N] [--only-calibration]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragbench.experiment.config.run import load_config  # noqa: E402
from ragbench.experiment.resources import load_model  # noqa: E402
from ragbench.experiment.runner import run  # noqa: E402
from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.llm.calibration import describe  # noqa: E402

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
        ]
    )
    llm._prefix_kv.clear()  # no prefix from the warm-up stays cached for the arms


def spread(ratios: list[float]) -> float:
    return round(max(ratios) / min(ratios), 3)


# one core busy with float matmuls, single-threaded BLAS: the "other job" on the machine
HOG = "import numpy as np\na = np.random.rand(384, 384)\nwhile True:\n    a = (a @ a) / 384.0"


class LoadSampler:
    """The 1-minute load average, sampled every ``every`` seconds while a run lasts."""

    def __init__(self, every: float = 2.0) -> None:
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def __enter__(self) -> LoadSampler:
        self.start = os.getloadavg()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end = os.getloadavg()

    def summary(self) -> dict:
        return {
            "load_avg_start": [round(v, 2) for v in self.start],
            "load_avg_end": [round(v, 2) for v in self.end],
            "load_1min_mean": round(statistics.mean(self.samples), 2),
        }


def hog() -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    return subprocess.Popen([sys.executable, "-c", HOG], env=env)


def ratio(values: list[float]) -> float:
    return round(max(values) / min(values), 4)


def reproducibility(quick: bool, threads: int) -> dict:
    """The ``cost_reproducibility`` section (module docstring)."""
    import torch

    torch.set_num_threads(threads)
    lengths, depths = ([1024], [50]) if quick else ([1024, 4096], [10, 50, 90])
    out: dict = {
        "threads": threads,
        "context_lengths": lengths,
        "depth_percents": depths,
        "target_calibrated_ratio": 1.05,
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        base = config(tmp, lengths, depths, 8, "repro")
        llm = load_model(load_config(base).model)
        t0 = time.perf_counter()
        rates = llm.cost_rates()  # measured once (or read from the cache) before any run
        out["calibration_seconds"] = round(time.perf_counter() - t0, 2)
        out["calibration"] = describe(rates)
        warm_up(llm)
        tables = {}
        for basis in ("calibrated", "measured"):
            for loaded in (False, True):
                cfg = {**base, "name": f"repro-{basis}-{int(loaded)}", "cost_basis": basis}
                beside = hog() if loaded else None
                try:
                    time.sleep(3 if loaded else 0)  # let the hog reach the load average
                    with LoadSampler() as load:
                        t0 = time.perf_counter()
                        df = run(cfg, progress=False, llm=llm)
                        wall = round(time.perf_counter() - t0, 2)
                finally:
                    if beside is not None:
                        beside.kill()
                        beside.wait()
                llm._prefix_kv.clear()  # each run starts with no document kept from the last
                tables[basis, loaded] = df
                row = {
                    "cost_basis": basis,
                    "cpu_hog_beside": loaded,
                    "wall_seconds": wall,
                    **load.summary(),
                    "records": len(df),
                    "mean_dollars_per_query": float(column(df, "dollars").mean()),
                    "mean_resource_seconds": round(float(column(df, "resource_seconds").mean()), 4),
                    "mean_modelled_seconds": round(float(column(df, "modelled_seconds").mean()), 4),
                    "charged_basis": sorted(set(column(df, "cost_basis"))),
                }
                out["runs"].append(row)
                print(
                    f"{basis} {'with' if loaded else 'without'} CPU hog: {wall} s, "
                    f"load {row['load_1min_mean']}",
                    flush=True,
                )
    for basis in ("calibrated", "measured"):
        means = [r["mean_dollars_per_query"] for r in out["runs"] if r["cost_basis"] == basis]
        out[f"{basis}_ratio"] = ratio(means)
    out["within_target"] = out["calibrated_ratio"] <= out["target_calibrated_ratio"]
    preds = [list(t["prediction"]) for t in tables.values()]
    out["same_predictions"] = all(p == preds[0] for p in preds)
    out["same_tokens"] = len({tuple(column(t, "completion_tokens")) for t in tables.values()}) == 1
    print(
        f"calibrated ratio {out['calibrated_ratio']} (target <= 1.05), measured ratio "
        f"{out['measured_ratio']}"
    )
    return out


def calibrated_vs_measured(quick: bool, threads: int, max_repeats: int = 8) -> dict:
    """The ``calibrated_vs_measured`` section (module docstring)."""
    import torch

    from ragbench.devices import cpu_flags
    from ragbench.experiment import resources
    from ragbench.llm.calibration import cpu_name

    torch.set_num_threads(threads)
    lengths = [1024] if quick else [1024, 4096, 7168]
    depths = [50] if quick else [10, 50, 90]
    out: dict = {
        "threads": threads,
        "context_lengths": lengths,
        "depth_percents": depths,
        "goal": "within 10%",
        "cell_interval_goal": CELL_INTERVAL,
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "load_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {**config(tmp, lengths, depths, 1, "calibration"), "cost_basis": "calibrated"}
        llm = load_model(load_config(cfg).model)
        warm_up(llm)
        # a calibration of its own, measured now at this load (a cached one was measured at
        # another time and load), probed to what the run sends, as a run probes
        llm.cache_dir = Path(tmp) / "cache"
        with LoadSampler() as load:
            t0 = time.perf_counter()
            rates = resources.calibrate(load_config(cfg), llm, resources.load_examples(cfg))
            out["calibration_seconds"] = round(time.perf_counter() - t0, 2)
        out["calibration_load"] = load.summary()
        out["calibration"] = describe(rates)
        with LoadSampler() as load:
            t0 = time.perf_counter()
            rows = _cells_until_tight(tmp, lengths, depths, llm, max_repeats)
            out["wall_seconds"] = round(time.perf_counter() - t0, 2)
    out.update(load.summary())
    out.update(_cell_table(rows, rates))
    for r in out["per_strategy_length"]:
        print(
            f"{r['strategy']:>12} {r['context_length']:>5}: modelled/measured "
            f"{r['modelled_over_measured']} (n {r['records']}, +-{r['measured_interval']})"
        )
    return out


CELL_INTERVAL = 0.05  # a cell's measured mean: its 95% interval within +-5% of it


def _interval(values: list[float]) -> float:
    """Half the width of the 95% t-interval of the mean of ``values``, relative to the mean."""
    from scipy.stats import t

    if len(values) < 2:
        return float("inf")
    half = t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return half / statistics.fmean(values)


def _cells_until_tight(tmp: str, lengths: list[int], depths: list[int], llm, max_repeats: int):
    """Each (strategy, length) cell's records, every request alone, repeated (the same examples,
    a new run folder, no prefix kept from the last) until its measured mean's 95% interval is
    within ``CELL_INTERVAL``, at most ``max_repeats`` times; every repeat runs all the cells
    still open, lengths interleaved, so all of them meet the same stretch of load."""
    rows: list[dict] = []
    for rep in range(max_repeats):
        open_cells = {
            (s, n)
            for s in STRATEGIES
            for n in lengths
            if _interval([r["measured"] for r in rows if (r["strategy"], r["length"]) == (s, n)])
            > CELL_INTERVAL
        }
        if not open_cells:
            break
        for length in lengths:
            names = [s for s in STRATEGIES if (s, length) in open_cells]
            if not names:
                continue
            cfg = {
                **config(tmp, [length], depths, 1, f"cells-{rep}-{length}"),
                "cost_basis": "calibrated",
                "strategies": [
                    s if s != "rag" else {"name": "rag", "params": {"top_k": 3}} for s in names
                ],
            }
            llm._prefix_kv.clear()  # each run computes its documents' prefixes, as alone
            df = run(cfg, progress=False, llm=llm)
            for i in range(len(df)):
                rows.append(
                    {
                        "strategy": str(df["strategy"].iloc[i]),
                        "length": length,
                        "repeat": rep,
                        "load_1min": os.getloadavg()[0],
                        "prompt_tokens": int(column(df, "prompt_tokens").iloc[i]),
                        "completion_tokens": int(column(df, "completion_tokens").iloc[i]),
                        "modelled": float(column(df, "modelled_seconds").iloc[i]),
                        "measured": float(column(df, "resource_seconds").iloc[i]),
                    }
                )
        print(
            f"repeat {rep}: {len(open_cells)} cells open, load {os.getloadavg()[0]:.2f}", flush=True
        )
    return rows


def _cell_table(rows: list[dict], rates) -> dict:
    """Per cell: records, means, the measured mean's interval, modelled / measured; and the same
    ratio had every probe stood for the median of its samples (prefills too; approximate: each
    record's modelled seconds scaled by the two fits' ratio on its plain prompt)."""
    from ragbench.llm import calibration

    plan = calibration.probe_plan(rates.meta["key"]["probed_tokens"])
    median, _ = calibration._fit_samples(plan, rates.meta["samples"], "median")
    table = []
    for s in STRATEGIES:
        for n in sorted({r["length"] for r in rows}):
            cell = [r for r in rows if (r["strategy"], r["length"]) == (s, n)]
            if not cell:
                continue
            measured = statistics.fmean(r["measured"] for r in cell)
            modelled = statistics.fmean(r["modelled"] for r in cell)
            old = statistics.fmean(
                r["modelled"]
                * median.alone(r["prompt_tokens"], r["completion_tokens"])
                / rates.alone(r["prompt_tokens"], r["completion_tokens"])
                for r in cell
            )
            table.append(
                {
                    "strategy": s,
                    "context_length": n,
                    "records": len(cell),
                    "prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in cell),
                    "modelled_seconds": round(modelled, 4),
                    "measured_seconds": round(measured, 4),
                    "measured_interval": round(_interval([r["measured"] for r in cell]), 4),
                    "modelled_over_measured": round(modelled / measured, 4),
                    "median_samples_over_measured": round(old / measured, 4),
                }
            )
    worst = max(abs(r["modelled_over_measured"] - 1) for r in table)
    return {
        "per_strategy_length": table,
        "records": rows,
        "records_per_cell": min(r["records"] for r in table),
        "cells_within_interval": sum(r["measured_interval"] <= CELL_INTERVAL for r in table),
        "worst_relative_error": round(worst, 4),
        "within_goal": worst <= 0.10,
        "worst_relative_error_median_samples": round(
            max(abs(r["median_samples_over_measured"] - 1) for r in table), 4
        ),
    }


def _plain(value):
    """A numpy scalar (a cell's record count, a load figure) as the Python number JSON takes."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k tokens, one depth, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each arm (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cost.json"))
    parser.add_argument(
        "--only-reproducibility",
        action="store_true",
        help="only cost_reproducibility, added to the JSON at --out",
    )
    parser.add_argument(
        "--repro-threads",
        type=int,
        default=2,
        help="torch threads of cost_reproducibility (2: the hog contends)",
    )
    parser.add_argument(
        "--only-calibration",
        action="store_true",
        help="only calibrated_vs_measured, added to the JSON at --out",
    )
    args = parser.parse_args(argv)
    if args.only_calibration:
        path = Path(args.out)
        result = json.loads(path.read_text()) if path.exists() else {}
        result["calibrated_vs_measured"] = calibrated_vs_measured(args.quick, args.repro_threads)
        atomic_write_text(path, json.dumps(result, indent=2, default=_plain) + "\n")
        print(f"wrote {path}")
        return result
    if args.only_reproducibility:
        path = Path(args.out)
        result = json.loads(path.read_text()) if path.exists() else {}
        result["cost_reproducibility"] = {
            "quick": args.quick,
            **reproducibility(args.quick, args.repro_threads),
        }
        atomic_write_text(path, json.dumps(result, indent=2, default=_plain) + "\n")
        print(f"wrote {path}")
        return result
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
    result["cost_reproducibility"] = {
        "quick": args.quick,
        **reproducibility(args.quick, args.repro_threads),
    }
    result["calibrated_vs_measured"] = calibrated_vs_measured(args.quick, args.repro_threads)
    print(
        f"spread {result['batched_over_alone_spread']} (per repeat {result['spread_per_repeat']}); "
        f"closed book < RAG < long context: {result['closed_book_below_rag']}"
    )
    atomic_write_text(args.out, json.dumps(result, indent=2, default=_plain) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
