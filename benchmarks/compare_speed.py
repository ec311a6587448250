"""How long a first ``ragbench compare`` takes, phase by phase: from the command to the verdict.

The input is built here, so nothing is fetched: ten of the Paul Graham essays shipped with the
embedded haystack (``ragbench.assets.essays_dir()``: real prose, about 26.6k tokens in all, which
long context cuts to SmolLM2's 8k window) as ten text files, and the 26 questions of
``benchmarks/compare_speed_questions.csv`` (answers found verbatim in the essays). Each arm runs
``ragbench compare DOCS --questions FILE`` in a fresh Python process, on the embedded defaults:

- ``cold``: a cache folder (``RAGBENCH_CACHE``) that has never seen the model: no converted
  weights, no calibration, no embeddings, no completions (a machine that has never calibrated);
- ``warm``: the same cache folder after ``cold``, with its calibration and converted weights
  kept and its completions and embeddings removed (a second ``compare`` on other documents).

The child process times the phases by wrapping the functions that do them (ingest, model load,
calibration, index build = embedding, generation, judge pass, report) and records each span's
start and end in seconds since the command began: spans that overlap ran in parallel. Writes
``benchmarks/results/compare_speed.json``: per arm the wall seconds to the verdict and to the end
(report included), the phases, and the load average (start, end, sampled mean), with the CPU
model, its flags and the torch thread count.

``--trees A,B`` runs each arm on each checkout in turn (its own cache folder), so two versions
are measured side by side at the same stretch of load. ``--arm-timeout S`` stops an arm after S
seconds (a busy machine): its row says ``timed_out``, keeps the spans that ended before (the child
writes its spans as each ends) and counts the records written; a later arm still runs on the
cache it left.

Usage: ``python benchmarks/compare_speed.py [--arms cold,warm] [--trees PATH,...] [--threads N]
[--arm-timeout S] [--out PATH]``; ``make bench-compare``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
# the checkout whose ragbench the arms run (--trees: another one, measured side by side)
sys.path.insert(0, os.environ.get("RAGBENCH_TREE") or str(ROOT))

# ten essays, about 26.6k SmolLM2 tokens together: the size the issue measured
ESSAYS = (
    "founders",
    "copy",
    "gba",
    "apple",
    "submarine",
    "boss",
    "desres",
    "useful",
    "langdes",
    "island",
)
QUESTIONS = Path(__file__).with_name("compare_speed_questions.csv")
PHASES = (
    "ingest",
    "estimate",
    "embed",
    "load_model",
    "calibrate",
    "generate",
    "judge",
    "verdict",
    "report",
)


def build_input(folder: Path) -> Path:
    """The ten essays copied into ``folder/docs`` (text files, as a user's folder holds them)."""
    from ragbench.assets import essays_dir

    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for name in ESSAYS:
        shutil.copyfile(essays_dir() / f"{name}.txt", docs / f"{name}.txt")
    return docs


# ------------------------------------------------------------------------ the child process


def _wrap(spans: list, phase: str, owner, attr: str, t0: float, save=None) -> None:
    """``owner.attr`` replaced by a function that appends ``(phase, start, end)`` to ``spans``
    (then calls ``save(spans)``: an arm stopped at its time cap keeps the spans that ended)."""
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        start = time.time() - t0  # epoch seconds: the parent's clock, across processes
        try:
            return inner(*args, **kwargs)
        finally:
            spans.append(
                {"phase": phase, "start": round(start, 2), "end": round(time.time() - t0, 2)}
            )
            if save is not None:
                save(spans)

    setattr(owner, attr, timed)


def child(args: list[str], spans_path: Path, t0: float) -> int:
    """``ragbench compare args`` in this process, its phases timed into ``spans_path``."""
    from ragbench.cli import app
    from ragbench.cli import compare as cli_compare
    from ragbench.experiment import resources, runner
    from ragbench.io import atomic_write_text
    from ragbench.llm import calibration
    from ragbench.workspace import compare as steps

    spans: list = []

    def save(done: list) -> None:
        atomic_write_text(spans_path, json.dumps(done))

    for phase, owner, attr in (
        ("ingest", steps, "ingest"),
        ("load_model", runner, "load_model"),  # the run's own load (before)
        ("load_model", resources, "load_model"),  # compare's warm-up (after)
        ("estimate", steps, "estimate"),
        ("calibrate", calibration, "measure"),
        ("embed", resources, "build_index"),
        ("generate", runner, "_generate"),
        ("judge", runner, "judge_pass"),
        ("verdict", steps, "decide"),
        ("report", steps, "write_report"),
    ):
        _wrap(spans, phase, owner, attr, t0, save)
    assert cli_compare.steps is steps
    code = 0
    try:
        app(["compare", *args], standalone_mode=False)
    except SystemExit as stop:
        code = int(stop.code or 0)
    finally:
        atomic_write_text(spans_path, json.dumps(spans))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        atomic_write_text(spans_path.with_suffix(".rss"), json.dumps(round(peak, 1)))
    return code


# ------------------------------------------------------------------------ the parent


def arm(
    name: str,
    tree: Path,
    cache: Path,
    docs: Path,
    work: Path,
    threads: int,
    cap: float | None,
    extra: tuple[str, ...] = (),
) -> dict:
    """One ``compare`` in a fresh process, ragbench from ``tree``, on cache folder ``cache``: its
    phases, load and peak memory; stopped after ``cap`` seconds (None: no cap); ``extra``: more
    ``compare`` options (``--model``)."""
    from benchmarks.cost import LoadSampler

    tag = f"{name}-{tree.name or 'tree'}"
    out, spans_path = work / f"out-{tag}", work / f"spans-{tag}.json"
    args = [
        str(docs),
        "--questions",
        str(QUESTIONS),
        "--output-dir",
        str(out),
        "--quiet",
        "--threads",
        str(threads),
        *extra,
    ]
    env = {
        **os.environ,
        "RAGBENCH_CACHE": str(cache),
        "RAGBENCH_TREE": str(tree),
        "PYTHONPATH": str(tree),
    }
    with LoadSampler() as load:
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(spans_path), repr(time.time()), *args],
                env=env,
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=cap,
            )
            code, text, timed_out = proc.returncode, proc.stdout + proc.stderr, False
        except subprocess.TimeoutExpired as stop:  # killed; what it printed so far
            code, timed_out = None, True
            text = "".join(
                part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                for part in (stop.stdout, stop.stderr)
            )
        wall = time.perf_counter() - start
    (work / f"{tag}.log").write_text(text)
    spans = json.loads(spans_path.read_text()) if spans_path.exists() else []
    rss = spans_path.with_suffix(".rss")
    verdict = next((s["end"] for s in spans if s["phase"] == "verdict"), None)
    phases = {
        p: round(sum(s["end"] - s["start"] for s in spans if s["phase"] == p), 2) for p in PHASES
    }
    lines = [
        ln
        for ln in text.splitlines()
        if ln.startswith(("verdict:", "calibrat", "warning: the calibrated"))
    ]
    return {
        "arm": name,
        "tree": str(tree),
        "exit_code": code,
        "timed_out": timed_out,
        "records_written": sum(
            len(p.read_text().splitlines()) for p in out.glob("*/records.jsonl")
        ),
        "wall_seconds": round(wall, 2),
        "seconds_to_verdict": verdict,
        "phase_seconds": phases,
        "peak_rss_mb": json.loads(rss.read_text()) if rss.exists() else None,
        "output_dir": str(out),
        "spans": spans,
        "lines": lines,
        **load.summary(),
    }


def warm_cache(cache: Path) -> None:
    """What a second ``compare`` on other documents finds: calibration and converted weights
    kept; completions and embeddings (of these documents) removed."""
    for name in ("completions.sqlite", "embeddings"):
        path = cache / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for extra in cache.glob("completions.sqlite*"):
        extra.unlink()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="cold,warm", help="cold, warm or both (in order)")
    parser.add_argument(
        "--trees",
        default=str(ROOT),
        help="checkouts to measure, comma-separated (each arm runs each in turn)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (--threads)")
    parser.add_argument(
        "--arm-timeout", type=float, default=None, help="seconds before an arm is stopped"
    )
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "compare_speed.json")
    )
    args = parser.parse_args(argv)
    from ragbench.devices import cpu_flags
    from ragbench.io import atomic_write_text
    from ragbench.llm.calibration import cpu_name

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    result: dict = {
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "threads": args.threads,
        "arm_timeout": args.arm_timeout,
        "essays": list(ESSAYS),
        "questions": QUESTIONS.name,
        "arms": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        work = Path(tmp)
        docs = build_input(work)
        for name in args.arms.split(","):
            for i, tree in enumerate(trees):  # side by side: each tree meets the same load
                cache = work / f"cache-{i}"
                if name == "warm":
                    warm_cache(cache)
                row = arm(name, tree, cache, docs, work, args.threads, args.arm_timeout)
                result["arms"].append(row)
                print(
                    f"{name} {tree}: {row['seconds_to_verdict']} s to the verdict, "
                    f"{row['wall_seconds']} s in all (exit {row['exit_code']}), load "
                    f"{row['load_1min_mean']}; {row['phase_seconds']}",
                    flush=True,
                )
                if row["exit_code"]:
                    print((work / f"{name}-{tree.name}.log").read_text()[-3000:])
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # one arm's process: spans file, start time, compare's args
        sys.exit(child(sys.argv[4:], Path(sys.argv[2]), float(sys.argv[3])))
    main()
