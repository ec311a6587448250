"""Big inputs: `ragbench data docs` on one 50 MB text file stays under 1 GB of memory.

The ingest runs in a fresh interpreter that reports its own peak RSS (``VmHWM``; not
``ru_maxrss``, which an exec'd process inherits from its parent), so the bound is that
command's, not the test session's (which may have loaded models). Time is
measured in ``benchmarks/docs_ingest.py``, not here.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from ragbench.datasets.corpus.file import read_documents
from ragbench.io import sha256_file

ROOT = Path(__file__).resolve().parents[1]
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


def write_big_text(path: Path, size: int, seed: int = 0) -> int:
    """Seeded words (a few non-ASCII: 2 bytes per character in memory), CRLF paragraphs."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(5000)]
    words += ["café", "naïve", "‘quoted’", "—", "don’t"]
    written = 0
    with path.open("w", encoding="utf-8", newline="") as f:
        while written < size:
            block = "\r\n\r\n".join(
                " ".join(rng.choices(words, k=rng.randint(40, 120))) + "." for _ in range(500)
            )
            written += f.write(block + "\r\n\r\n")  # characters: about the bytes
    return path.stat().st_size


def run_docs(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """The CLI in a fresh interpreter; (its result, its own peak RSS in bytes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, cwd=ROOT
    )
    peaks = [ln for ln in proc.stderr.splitlines() if ln.startswith("maxrss_kib=")]
    assert peaks, proc.stderr[-2000:]
    return proc, int(peaks[-1].split("=")[1]) * 1024


@pytest.mark.slow
def test_a_50_mb_text_file_is_ingested_in_under_1_gb(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    size = write_big_text(folder / "big.txt", 50_000_000)
    out = tmp_path / "corpus.jsonl"
    proc, peak = run_docs(str(folder), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote 1 documents" in proc.stdout
    assert proc.stdout.split("fingerprint ")[1].strip() == sha256_file(out)
    assert peak < 1_000_000_000, f"peak RSS {peak / 1e6:.0f} MB for a {size / 1e6:.0f} MB file"
    [doc] = read_documents(out)
    assert doc.meta["sha256"] == sha256_file(folder / "big.txt")
    assert "\r" not in doc.text[:10_000] and doc.text.startswith(doc.text.lstrip())
    assert json.loads(out.read_text(encoding="utf-8"))["id"] == "big.txt"
