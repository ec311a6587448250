"""Which embedded model should ``ragbench compare`` default to: SmolLM2-135M or gemma3-270m.

Both answer the same real documents and questions as ``make bench-compare`` (ten Paul Graham
essays shipped with the haystack, about 26.6k SmolLM2 tokens, and the 26 questions of
``benchmarks/compare_speed_questions.csv``, answers verbatim in the essays), each in a fresh
process on a cache folder of its own that has never seen the model (a first ``compare``: weights
converted, calibrated, embedded, generated, judged). Per model it records:

- accuracy per strategy (the ``contains`` score compare's verdict reads, mean over the 26
  questions) and the verdict line;
- seconds to the verdict (and per phase), peak resident memory of the process;
- what a user learns per minute: the points the best strategy wins over closed book (what the
  documents are worth) and the points between RAG and long context (what the verdict decides
  on), each per minute to the verdict.

The models run one after the other, in the order given, so they meet different stretches of
load: the load average is recorded beside each (``LoadSampler``), and the accuracies do not
depend on it (greedy decoding). Writes ``benchmarks/results/embedded_models.json``.

Usage: ``python benchmarks/embedded_models.py [--models smollm2-135m-instruct,gemma3-270m]
[--threads 2] [--arm-timeout S] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import compare_speed  # noqa: E402

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
METRIC = "contains"  # what compare's verdict reads for these short answers


def accuracy(output_dir: Path) -> dict[str, float]:
    """Mean ``METRIC`` per strategy variant of the run ``compare`` wrote under ``output_dir``."""
    from ragbench.analysis.gate import load_run

    [run] = [p.parent for p in output_dir.glob("*/results.parquet")]
    table, _ = load_run(run)
    means = table.groupby("label")[METRIC].mean()
    return {str(k): round(100 * float(v), 1) for k, v in means.items()}


def learned(scores: dict[str, float], minutes: float | None) -> dict:
    """What a first verdict tells, per minute to it: how far the best variant is above closed
    book (what the documents are worth) and how far RAG and long context are apart (the margin
    the verdict decides on), in points."""

    def first(prefix: str) -> float:
        return max((v for k, v in scores.items() if k.startswith(prefix)), default=0.0)

    best = max(scores.items(), key=lambda kv: kv[1], default=(None, 0.0))
    worth = round(best[1] - first("closed_book"), 1)
    margin = round(abs(first("rag") - first("long_context")), 1)
    return {
        "best": best[0],
        "best_points": best[1],
        "over_closed_book_points": worth,
        "rag_vs_long_context_points": margin,
        "over_closed_book_points_per_minute": round(worth / minutes, 2) if minutes else None,
        "rag_vs_long_context_points_per_minute": round(margin / minutes, 2) if minutes else None,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arm-timeout", type=float, default=None)
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "embedded_models.json")
    )
    args = parser.parse_args(argv)
    from ragbench.devices import cpu_flags
    from ragbench.io import atomic_write_text
    from ragbench.llm.calibration import cpu_name

    result: dict = {
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "threads": args.threads,
        "questions": compare_speed.QUESTIONS.name,
        "essays": list(compare_speed.ESSAYS),
        "metric": METRIC,
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        work = Path(tmp)
        docs = compare_speed.build_input(work)
        for i, model in enumerate(args.models.split(",")):
            row = compare_speed.arm(
                f"cold-{model}",
                ROOT,
                work / f"cache-{i}",
                docs,
                work,
                args.threads,
                args.arm_timeout,
                ("--model", model),
            )
            row["model"] = model
            minutes = (row["seconds_to_verdict"] or 0) / 60 or None
            if row["exit_code"] == 0:
                try:
                    row["accuracy"] = accuracy(Path(row["output_dir"]))
                    row["learned"] = learned(row["accuracy"], minutes)
                except Exception as exc:  # the timings are still worth keeping
                    row["accuracy_error"] = repr(exc)
            else:
                log = work / f"cold-{model}-{ROOT.name}.log"
                row["log_tail"] = log.read_text()[-3000:] if log.exists() else None
            row.pop("output_dir")
            result["models"].append(row)
            print(
                f"{model}: {row['seconds_to_verdict']} s to the verdict, peak "
                f"{row['peak_rss_mb']} MB, load {row['load_1min_mean']}; "
                f"accuracy {row.get('accuracy')}; {row.get('learned')}",
                flush=True,
            )
            atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
