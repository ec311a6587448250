"""Runner benchmarks on this machine, each a side-by-side in one process with one loaded model
and the completion cache off (every arm generates everything):

- batching: the same experiment with records generated one at a time (``model.batch_size: 1``)
  and in rounds of 8 (the default): wall seconds, ratio, same predictions and scores;
- shared corpus: many questions over one ~4k-token corpus (``write_essay_corpus``: the embedded
  essays with one needle per question), ``long_context``, with prefix reuse (the corpus KV
  computed once for the run) and without (``prefix_reuse: false``: every prompt prefilled whole):
  ``shared_corpus_speedup``, both wall times, ``same_predictions``, the cached-token accounting;
  then the same questions with ``preload: true`` (the one-time cost apart) and the finished
  config run again without a model (``resumed_seconds``: a resumed run loads no model).

Writes benchmarks/results/runner.json. Usage: ``python benchmarks/runner.py [--quick]
[--corpus-only] [--threads N] [--out PATH]``.
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

from ragbench.experiment.config.run import load_config  # noqa: E402
from ragbench.experiment.resources import load_model  # noqa: E402
from ragbench.experiment.runner import run  # noqa: E402
from ragbench.io import atomic_write_text  # noqa: E402


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


def corpus_config(out: str, corpus, reuse: bool, threads: int, preload: bool = False) -> dict:
    name = "preload" if preload else "reuse" if reuse else "no-reuse"
    return {
        "name": f"bench-corpus-{name}",
        "dataset": {
            "name": "corpus",
            "params": {"corpus": str(corpus[0]), "questions": str(corpus[1])},
        },
        # the llm passed to run() is the one loaded model; its params here name each arm
        "model": {
            "backend": "hf",
            "cache": False,
            "threads": threads,
            "params": {"prefix_reuse": reuse},
        },
        "strategies": [{"name": "long_context", "params": {"preload": preload}}],
        "metrics": ["string_match_all"],
        "output_dir": out,
    }


def shared_corpus(questions: int, threads: int) -> dict:
    """Prefix reuse on vs off (then preload, then a resumed run) on one shared corpus."""
    from ragbench.datasets.corpus.shared import write_essay_corpus

    result: dict = {"questions": questions, "threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_essay_corpus(Path(tmp) / "corpus", questions=questions, tokens=4000)
        cfg = {
            arm: corpus_config(tmp, corpus, arm != "no_reuse", threads, arm == "preload")
            for arm in ("reuse", "no_reuse", "preload")
        }
        llm = load_model(load_config(cfg["reuse"]).model)
        llm.cost_rates()  # calibration before any clock starts
        tables = {}
        for arm in ("reuse", "no_reuse", "preload"):
            llm.prefix_reuse = arm != "no_reuse"
            llm._prefix_kv.clear()  # each arm starts cold
            t0 = time.perf_counter()
            tables[arm] = run(cfg[arm], progress=False, llm=llm)
            result[f"{arm}_seconds"] = round(time.perf_counter() - t0, 2)
            print(f"shared corpus, {arm}: {result[f'{arm}_seconds']} s")
        on, off, pre = tables["reuse"], tables["no_reuse"], tables["preload"]
        result["corpus_prompt_tokens"] = int(off["prompt_tokens"].min())
        result["shared_corpus_speedup"] = round(
            result["no_reuse_seconds"] / result["reuse_seconds"], 2
        )
        result["same_predictions"] = bool((on["prediction"] == off["prediction"]).all())
        result["same_predictions_preload"] = bool((on["prediction"] == pre["prediction"]).all())
        result["errors"] = int(sum(t["error"].notna().sum() for t in tables.values()))
        # the corpus is computed once: one record with cached 0, the others cached
        result["reuse_records_cached_0"] = int((on["cached_prompt_tokens"] == 0).sum())
        result["reuse_cached_tokens"] = sorted(set(on["cached_prompt_tokens"].astype(int)))
        result["no_reuse_cached_tokens"] = sorted(set(off["cached_prompt_tokens"].astype(int)))
        result["string_match_all"] = round(float(on["string_match_all"].mean()), 3)
        result["preload"] = {
            "one_time_seconds": round(float(pre["one_time_seconds"].iloc[0]), 3),
            "amortised_over": int(pre["amortised_over"].iloc[0]),
            "per_query_resource_seconds": round(float(pre["resource_seconds"].mean()), 3),
            "amortised_resource_seconds": round(float(pre["amortised_resource_seconds"].mean()), 3),
            "records_cached": int((pre["cached_prompt_tokens"] > 0).sum()),
        }
        t0 = time.perf_counter()
        again = run(cfg["reuse"], progress=False)  # no llm=: a model load would show here
        result["resumed_seconds"] = round(time.perf_counter() - t0, 2)
        result["resumed_same_table"] = bool(again["prediction"].equals(on["prediction"]))
    print(
        f"shared corpus speedup {result['shared_corpus_speedup']}x over {questions} questions; "
        f"resumed run {result['resumed_seconds']} s"
    )
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k-token haystacks only")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "runner.json"))
    parser.add_argument("--corpus-only", action="store_true", help="skip the batching comparison")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: a loaded shared CPU; OpenMP spin-waits otherwise)",
    )
    args = parser.parse_args(argv)
    lengths = [1024] if args.quick else [1024, 2048]
    result: dict = {"date": time.strftime("%Y-%m-%d"), "load_start": os.getloadavg()}
    result["shared_corpus"] = shared_corpus(20 if args.quick else 50, args.threads)
    result["shared_corpus_speedup"] = result["shared_corpus"]["shared_corpus_speedup"]
    result["resumed_seconds"] = result["shared_corpus"]["resumed_seconds"]
    if args.corpus_only:
        return _write(args.out, result)
    result["context_lengths"] = lengths
    with tempfile.TemporaryDirectory() as tmp:
        llm = load_model(load_config(config(tmp, lengths, 1)).model)  # one model for both arms
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
    print(f"speedup {result['speedup']}x; same predictions {result['same_predictions']}/{len(a)}")
    return _write(args.out, result)


def _write(out: str, result: dict) -> dict:
    result["load_end"] = os.getloadavg()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
