"""`ragbench data docs` on one big text file: peak memory and time, in a fresh process.

Generates one UTF-8 text file of the asked size (seeded random words from a 5,000-word
vocabulary with a few non-ASCII words, so the text is stored 2 bytes per character as most real
English with curly quotes is; paragraphs of 40-120 words, CRLF line ends) and runs the CLI
(``ragbench data docs FILE --out ...``) in a subprocess that reports its own peak RSS when it
exits (``VmHWM``: ``ru_maxrss`` would include the parent's peak). Records the file size, peak
RSS, peak / file size, wall seconds, the corpus fingerprint, the CPU model, the load average
before and after, and the peak of the same command on a 1 kB file (the imports, ~115 MB), so
small files' ratios can be read.

Target (hardening issue): peak under 10x the largest file (a 50 MB file under 1 GB). Before
streaming, a 50 MB text file peaked at 6.05 GB (reported) and 8.7 GB (measured here, ASCII
text), 120-170x the file.

Writes benchmarks/results/docs_ingest.json. Usage: ``python benchmarks/docs_ingest.py
[--quick] [--mb N] [--out PATH]`` (``--quick``: 5 MB instead of 50).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.llm.calibration import cpu_name  # noqa: E402

# run in the child: the CLI, then its own peak RSS (KiB on Linux) on stderr, whatever the exit
CHILD = """
import atexit, resource, sys

def peak_kib():
    # VmHWM: this process's own peak. ru_maxrss is not: exec keeps the high-water mark of the
    # process that spawned it (a test session with models loaded reads as this command's peak)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak

atexit.register(lambda: print(f"maxrss_kib={peak_kib()}", file=sys.stderr))
from ragbench.cli import app
sys.argv = ["ragbench", "data", "docs", *sys.argv[1:]]
app()
"""


def write_text_file(path: Path, size: int, seed: int = 0) -> int:
    """A seeded text file of about ``size`` bytes; returns its exact size."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(5000)]
    words += ["café", "naïve", "‘quoted’", "—", "“so”", "Straße", "don’t"]
    written = 0
    with path.open("w", encoding="utf-8", newline="") as f:
        while written < size:
            block = "\r\n\r\n".join(
                " ".join(rng.choices(words, k=rng.randint(40, 120))) + "." for _ in range(200)
            )
            data = block + "\r\n\r\n"
            f.write(data)
            written += len(data.encode("utf-8"))
    return path.stat().st_size


def ingest(file: Path, out: Path) -> dict:
    """Run the CLI on ``file`` in a fresh interpreter: its peak RSS, seconds and output."""
    cmd = [sys.executable, "-c", CHILD, str(file), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    maxrss = [ln for ln in proc.stderr.splitlines() if ln.startswith("maxrss_kib=")]
    fingerprint = proc.stdout.split("fingerprint ")[-1].strip()
    return {
        "peak_rss_bytes": int(maxrss[-1].split("=")[1]) * 1024,
        "seconds": round(seconds, 2),
        "fingerprint": fingerprint,
        "output_bytes": out.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 5 MB file instead of 50 MB")
    parser.add_argument("--mb", type=float, default=None, help="file size in MB (1e6 bytes)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/docs_ingest.json"))
    args = parser.parse_args()
    mb = args.mb if args.mb is not None else 5.0 if args.quick else 50.0
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_model": cpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        file = folder / "big.txt"
        (Path(tmp) / "tiny").mkdir()
        write_text_file(Path(tmp) / "tiny" / "tiny.txt", 1000)
        # the interpreter, the CLI and ftfy/datasketch/numpy loaded: what any file costs
        baseline = ingest(Path(tmp) / "tiny" / "tiny.txt", Path(tmp) / "tiny.jsonl")
        size = write_text_file(file, int(mb * 1e6))
        run = ingest(file, Path(tmp) / "corpus.jsonl")
    above = run["peak_rss_bytes"] - baseline["peak_rss_bytes"]
    result |= {
        "file_bytes": size,
        "file_mb": round(size / 1e6, 2),
        **run,
        "peak_rss_mb": round(run["peak_rss_bytes"] / 1e6, 1),
        "peak_over_file": round(run["peak_rss_bytes"] / size, 2),
        "target_peak_over_file": 10,
        "baseline_peak_rss_mb": round(baseline["peak_rss_bytes"] / 1e6, 1),  # a 1 kB file
        "above_baseline_over_file": round(above / size, 2),
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
