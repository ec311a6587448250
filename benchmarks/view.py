"""The per-question view at scale (``make bench-view``): 2,000 questions x 4 variants (closed
book, long context, RAG k=5 and Self-Route over 256-token chunks, every question on its own
document, so no chunk is shared: the page's worst case), written as a run folder; then
``ragbench view`` on it, and headless Chromium timing the first rows, a filter and a search.

Targets (issue 44): the page <= 25 MB; first rows and a filter <= 2 s each. Writes
benchmarks/results/view.json with the CPU model, flags and load beside the figures."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import pandas as pd  # noqa: E402
from browser import chromium_page  # noqa: E402

from ragbench.devices import cpu_flags  # noqa: E402
from ragbench.experiment.results import parquet_bytes  # noqa: E402
from ragbench.io import atomic_write_text, dumps_canonical  # noqa: E402
from ragbench.llm.calibration import cpu_name  # noqa: E402
from ragbench.report.explore import write_view  # noqa: E402
from ragbench.strategies.rag import chunk_ref  # noqa: E402
from ragbench.types import Chunk  # noqa: E402

WORDS = [
    "retrieval",
    "context",
    "window",
    "token",
    "budget",
    "answer",
    "evidence",
    "document",
    "chunk",
    "model",
    "question",
    "latency",
    "dollars",
    "prefix",
    "cache",
    "memory",
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "on",
    "with",
    "as",
]
CHUNK_WORDS = 256 * 3 // 4  # 256 tokens of prose: ~190 words
VARIANTS = {
    "closed_book": ("closed_book", {}),
    "long_context": ("long_context", {"overflow": "truncate_middle"}),
    "rag k=5 chunk=256": ("rag", {"top_k": 5, "chunk_size": 256}),
    "self_route k=5 chunk=256": ("self_route", {"top_k": 5, "chunk_size": 256}),
}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def write_run(folder: Path, questions: int, seed: int = 0) -> dict:
    """A run folder as ragbench writes it (results, questions, chunk texts), synthetic."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows, qrows, chunk_lines = [], [], {}
    for q in range(questions):
        doc = f"doc-{q:05d}"
        chunks = [Chunk(f"{doc}#{i}", doc, _text(rng, CHUNK_WORDS), 0, 0) for i in range(8)]
        for c in chunks:
            chunk_lines[chunk_ref(c)] = {"ref": chunk_ref(c), "doc_id": doc, "text": c.text}
        gold = chunks[rng.randrange(8)]
        answer = f"answer-{q}"
        qrows.append(
            {
                "example_id": f"q{q}",
                "question": _text(rng, 14) + "?",
                "answers": [answer],
                "doc_ids": [doc],
                "gold_docs": [doc],
            }
        )
        for label, (strategy, params) in VARIANTS.items():
            right = rng.random() < {"closed_book": 0.1}.get(strategy, 0.6)
            row = {
                "example_id": f"q{q}",
                "strategy": strategy,
                "label": label,
                "params": dumps_canonical(params),
                "error": None,
                "prediction": (answer if right else _text(rng, 8)) + " " + _text(rng, 10),
                "answers": [answer],
                "contains": float(right),
                "dollars": rng.uniform(1e-5, 1e-3),
                "latency_seconds": rng.uniform(0.1, 3),
                "resource_seconds": rng.uniform(0.1, 3),
            }
            if strategy in ("rag", "self_route"):
                top = rng.sample(chunks, 5)
                row |= {
                    "retrieved": [c.id for c in top],
                    "retrieved_refs": [chunk_ref(c) for c in top],
                    "retrieved_scores": sorted((rng.random() for _ in top), reverse=True),
                    "gold_chunks": [gold.id],
                    "gold_refs": [chunk_ref(gold)],
                    "gold_hit": gold in top,
                }
            if strategy == "long_context":
                row |= {
                    "kept_tokens": 7900,
                    "truncated_tokens": rng.randrange(0, 5000),
                    "evidence_truncated": rng.random() < 0.2,
                    "dropped_documents": 0,
                }
            if strategy == "self_route":
                row["route"] = rng.choice(["rag", "long_context"])
            rows.append(row)
    (folder / "results.parquet").write_bytes(parquet_bytes(pd.DataFrame(rows)))
    (folder / "questions.parquet").write_bytes(parquet_bytes(pd.DataFrame(qrows)))
    text = "".join(json.dumps(line) + "\n" for line in chunk_lines.values())
    (folder / "chunks.jsonl").write_text(text, encoding="utf-8")
    return {"questions": questions, "variants": len(VARIANTS), "chunks": len(chunk_lines)}


def time_page(page_path: Path) -> dict:
    """Seconds until the first rows show (from navigation start), until a filter and a search
    have redrawn, and until an expanded row shows."""
    rows = ".rbv-table tbody tr:not(:has(> td[colspan]))"
    with chromium_page(page_path.as_uri()) as page:
        page.wait_for_selector(".rbv[data-loaded='1']", state="attached", timeout=60000)
        # from the page's navigation start (the browser's own start is not the page's)
        first_rows = float(page.locator(".rbv").get_attribute("data-shown-ms")) / 1000
        assert page.locator(rows).count() > 0
        t1 = time.perf_counter()
        page.select_option("select[data-filter='A']", label="rag k=5 chunk=256")
        page.select_option("select[data-filter='B']", label="long_context")
        page.select_option("select[data-filter='outcome']", "a_only")
        page.wait_for_function(
            "document.querySelector('.dt-info').textContent.includes('filtered')"
        )
        filtered = time.perf_counter() - t1
        info = page.locator(".dt-info").inner_text()
        t2 = time.perf_counter()
        page.fill("input[data-filter='search']", "answer-1999")
        page.wait_for_function(
            "document.querySelector('.dt-info').textContent.includes('1 of')"
            " || document.querySelector('.dt-info').textContent.includes('0 to 0')"
        )
        searched = time.perf_counter() - t2
        t3 = time.perf_counter()
        page.fill("input[data-filter='search']", "")
        page.select_option("select[data-filter='outcome']", "all")
        page.click(".rbv-table tbody tr:first-child td:nth-child(2)")
        page.wait_for_selector(".rbv-detail")
        expanded = time.perf_counter() - t3
        errors = list(page.errors)
    return {
        "first_rows_seconds": round(first_rows, 3),
        "filter_seconds": round(filtered, 3),
        "search_seconds": round(searched, 3),
        "expand_seconds": round(expanded, 3),
        "filter_info": info,
        "page_errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/view.json"))
    args = parser.parse_args()
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_model": cpu_name(),
        "cpu_flags": cpu_flags(),
        "cpus": os.cpu_count(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "bench-run"
        result |= write_run(run, args.questions)
        t0 = time.perf_counter()
        page = write_view(run, Path(tmp) / "view.html")
        result["write_seconds"] = round(time.perf_counter() - t0, 3)
        result["page_mb"] = round(page.stat().st_size / 1e6, 2)
        result |= time_page(page)
    result |= {
        "target_page_mb": 25,
        "target_seconds": 2.0,
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }
    result["holds"] = (
        result["page_mb"] <= 25
        and result["first_rows_seconds"] <= 2
        and result["filter_seconds"] <= 2
    )
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "cpu_flags"}, indent=2))


if __name__ == "__main__":
    main()
