"""Retrieval benchmark: ragbench (FAISS + embedding cache) vs llama-index's VectorStoreIndex.

Both sides index the same chunks with the same loaded sentence-transformers model (the embedded
all-MiniLM-L6-v2) and the same batch size, and answer the same queries, in one run:

- ``essays``: the Paul Graham essays chunked at 128 SmolLM2 tokens (~1.2k chunks);
- ``generated``: 10k deterministic chunks of essay words (seeded).

llama-index gets the model through a local ``BaseEmbedding`` subclass (llama-index-embeddings-
huggingface is not a dependency). Model loading and chunking are outside the timed sections.

Output: ``benchmarks/results/retrieval.json`` (``--out`` to change), with for each corpus:

- ``ragbench.build_cold_s`` (embed + index, empty embedding cache), ``build_warm_s`` (same
  chunks again through a fresh embedder on the filled cache), ``query_s`` (one batch
  ``retrieve`` of all queries, k=10; warm = query embeddings cached too), ``end_to_end_*_s``;
- ``llamaindex.build_s`` (``VectorStoreIndex(nodes)``), ``query_s`` (``retriever.retrieve``
  per query: its API is one query at a time), ``end_to_end_s``;
- the cold numbers on both sides are medians over ``rounds`` (``--rounds``, default 3 on the
  essays, 1 on the generated corpus): each round runs ragbench cold (a fresh embedder, an empty
  cache) and llama-index back to back, the order alternating from round to round so machine
  load and first-use kernel set-up fall on both sides alike; every round's times and load
  average are under ``cold_rounds``;
- ``speedup_warm`` / ``speedup_cold``: llama-index end-to-end time over ragbench's (target >= 2
  warm); ``padded_tokens``: the token slots each side's batches feed the model (ragbench batches
  by token length, sentence-transformers alone by characters, llama-index in chunks of 64 in
  corpus order), with the real tokens;
- ``topk_agreement``: fraction of queries whose top-k id lists are identical, whose top-k sets
  are identical, and the mean overlap |A∩B|/k (target: identical for the exact index);
- ``faiss_search_us``: FAISS search latency per query in microseconds, one query at a time
  (median) and amortised over the batch, for ``Flat`` (exact) and ``HNSW32``.

The headline ``default_cold_speedup_vs_llamaindex`` is the essays' ``speedup_cold`` (default fp32
embedder; target >= 1.0), with ``default_top10_identical_to_llamaindex`` (every round's top-10
lists equal llama-index's) and ``default_top10_identical_to_prefix`` (equal to ragbench's own
lists from before token-length batching, ``results/retrieval_top10_reference.json``; null with
``--quick``, whose corpus differs).

and ``embedding_throughput``: texts/s of ``model.encode(texts, batch_size)`` called directly vs
ragbench's ``embed_documents`` (cache off, and cold cache), best of ``--repeats`` alternating
runs, with the ratios (target: within 5%).

and ``fast_embedders`` (``benchmarks/retrieval_fast.py``): the faster embedders (``minilm-bf16``,
bf16 weights, ONNX int8 and fp32) side by side against the fp32 PyTorch encode
(``embed_speedup_vs_torch``), their top-10 overlap with the fp32 index on the essay queries
(``top10_overlap``) and their cold end-to-end retrieval against llama-index
(``cold_speedup_vs_llamaindex``), each under ``variants``; the headline keys are
``minilm-bf16``'s (``headline_embedder``); targets >= 2.0, >= 0.95, >= 2.0.

Usage: ``python benchmarks/retrieval.py [--quick] [--out PATH]`` (``make bench-retrieval``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
# benchmarks/ goes last: a script here named like a standard module must not shadow it
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(ROOT))
sys.path.append(str(BENCH))

from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.llm.calibration import cpu_name  # noqa: E402
from ragbench.types import Chunk, Document  # noqa: E402

K = 10
BATCH_SIZE = 64
REFERENCE = BENCH / "results" / "retrieval_top10_reference.json"


def essay_chunks(limit: int | None) -> list[Chunk]:
    from ragbench.assets import essays_dir
    from ragbench.retrieval.chunking import chunk_documents

    files = sorted(essays_dir().glob("*.txt"))
    docs = [Document(p.stem, p.read_text(encoding="utf-8")) for p in files]
    chunks = chunk_documents(docs, "sentence", 128, 16, "smollm2-135m-instruct")
    return chunks[:limit] if limit else chunks


def generated_chunks(n: int, vocabulary: list[str], seed: int = 0) -> list[Chunk]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # 40-70 words of essay vocabulary: about 128 MiniLM tokens, like the essay chunks
        text = " ".join(rng.choices(vocabulary, k=rng.randint(40, 70))) + "."
        out.append(Chunk(f"gen#{i}", "gen", text, 0, len(text)))
    return out


def make_queries(chunks: list[Chunk], n: int, seed: int = 1) -> list[str]:
    """Short queries: 6-10 consecutive words from random chunks (deterministic)."""
    rng = random.Random(seed)
    out = []
    for chunk in rng.sample(chunks, min(n, len(chunks))):
        words = chunk.text.split()
        start = rng.randrange(max(1, len(words) - 10))
        out.append(" ".join(words[start : start + rng.randint(6, 10)]))
    return out


def llama_embedding(model, batch_size: int):
    """A llama-index BaseEmbedding around an already loaded SentenceTransformer."""
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from pydantic import PrivateAttr

    class SentenceTransformerLlamaEmbedding(BaseEmbedding):
        _model: Any = PrivateAttr()

        def __init__(self, model, batch_size: int) -> None:
            super().__init__(model_name="all-MiniLM-L6-v2", embed_batch_size=batch_size)
            self._model = model

        def _encode(self, texts: list[str]) -> list[list[float]]:
            vectors = self._model.encode(
                texts, batch_size=self.embed_batch_size, normalize_embeddings=True
            )
            return vectors.tolist()

        def _get_query_embedding(self, query: str) -> list[float]:
            return self._encode([query])[0]

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return self._encode([text])[0]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return self._encode(texts)

    return SentenceTransformerLlamaEmbedding(model, batch_size)


def new_embedder(cache_root: Path | None):
    """A ragbench embedder with its model loaded and its identity hashed (one-time costs that
    are not what is measured)."""
    from ragbench.retrieval.embedders.base import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder(
        None, "cpu", BATCH_SIZE, cache_dir=cache_root, cache=cache_root is not None
    )
    emb.model, emb.identity()
    return emb


def ragbench_cold(chunks: list[Chunk], queries: list[str], cache_root: Path) -> dict:
    """One cold ragbench run: a fresh embedder on an empty cache, build, one batch of queries."""
    from ragbench.retrieval.retrievers import DenseRetriever

    emb = new_embedder(cache_root)
    t = time.perf_counter()
    dense = DenseRetriever(chunks, emb)
    build = time.perf_counter() - t
    padded = emb.padded_tokens  # the chunks' (before the queries')
    t = time.perf_counter()
    hits = dense.retrieve(queries, K)
    query = time.perf_counter() - t
    ids = [[h.chunk.id for h in r] for r in hits]
    return {"build_s": build, "query_s": query, "ids": ids, "padded_tokens": padded}


def llamaindex_run(chunks: list[Chunk], queries: list[str], model) -> dict:
    """One llama-index run: ``VectorStoreIndex(nodes)`` (embeds every node), then its
    retriever one query at a time (its API)."""
    from llama_index.core import VectorStoreIndex

    from ragbench.retrieval.llamaindex import chunk_to_node

    nodes = [chunk_to_node(c) for c in chunks]
    t = time.perf_counter()
    index = VectorStoreIndex(nodes, embed_model=llama_embedding(model, BATCH_SIZE))
    build = time.perf_counter() - t
    retriever = index.as_retriever(similarity_top_k=K)
    t = time.perf_counter()
    theirs = [retriever.retrieve(q) for q in queries]
    query = time.perf_counter() - t
    return {"build_s": build, "query_s": query, "ids": [[n.node.id_ for n in r] for r in theirs]}


def padded_tokens(chunks: list[Chunk], model, ragbench: int) -> dict:
    """Token slots fed to the model: llama-index sends batches of 64 in corpus order (each pads
    to its longest); sentence-transformers alone sorts by characters; ragbench by tokens."""
    from ragbench.retrieval.embedders.base import token_lengths

    lengths = token_lengths(model, [c.text for c in chunks])

    def padded(order: list[int]) -> int:
        batches = [order[s : s + BATCH_SIZE] for s in range(0, len(order), BATCH_SIZE)]
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    by_chars = sorted(range(len(chunks)), key=lambda i: -len(chunks[i].text))
    return {
        "real": sum(lengths),
        "ragbench": ragbench,
        "llamaindex": padded(list(range(len(chunks)))),
        "sentence_transformers_char_sorted": padded(by_chars),
    }


def bench_corpus(
    chunks: list[Chunk], queries: list[str], model, cache_root: Path, rounds: int = 1
) -> dict:
    from ragbench.retrieval.retrievers import DenseRetriever

    cold_rounds, ours_cold, theirs, padded = [], [], [], 0
    for r in range(rounds):
        # round 0 fills cache_root (the warm runs below and retrieval_fast read it)
        root = cache_root if r == 0 else cache_root.with_name(f"{cache_root.name}-cold{r}")
        row: dict[str, Any] = {"first": "ragbench" if r % 2 == 0 else "llamaindex"}
        for side in ("ragbench", "llamaindex") if r % 2 == 0 else ("llamaindex", "ragbench"):
            if side == "ragbench":
                run = ragbench_cold(chunks, queries, root)
                ours_cold.append(run["ids"])
                padded = run["padded_tokens"]
            else:
                run = llamaindex_run(chunks, queries, model)
                theirs.append(run["ids"])
            row[side] = {k: v for k, v in run.items() if k.endswith("_s")}
            row[side]["end_to_end_s"] = run["build_s"] + run["query_s"]
        row["load_average"] = os.getloadavg()
        cold_rounds.append(row)
        print(f"[bench]   round {r}: {json.dumps(row)}", flush=True)

    def median(side: str, key: str) -> float:
        return statistics.median(row[side][key] for row in cold_rounds)

    emb = new_embedder(cache_root)
    t = time.perf_counter()
    warm = DenseRetriever(chunks, emb)
    build_warm = time.perf_counter() - t
    t = time.perf_counter()
    ours = warm.retrieve(queries, K)
    query_warm = time.perf_counter() - t

    a = [[h.chunk.id for h in r] for r in ours]
    b = theirs[0]
    rb_cold, rb_warm = median("ragbench", "end_to_end_s"), build_warm + query_warm
    li = median("llamaindex", "end_to_end_s")
    return {
        "chunks": len(chunks),
        "queries": len(queries),
        "k": K,
        "rounds": rounds,
        "ragbench": {
            "build_cold_s": median("ragbench", "build_s"),
            "build_warm_s": build_warm,
            "query_cold_s": median("ragbench", "query_s"),
            "query_warm_s": query_warm,
            "end_to_end_cold_s": rb_cold,
            "end_to_end_warm_s": rb_warm,
        },
        "llamaindex": {
            "build_s": median("llamaindex", "build_s"),
            "query_s": median("llamaindex", "query_s"),
            "end_to_end_s": li,
        },
        "speedup_warm": li / rb_warm,
        "speedup_cold": li / rb_cold,
        "cold_rounds": cold_rounds,
        "top10_cold_runs_identical": all(x == a for x in ours_cold) and all(x == b for x in theirs),
        "top10_identical_to_prefix": against_reference(chunks, queries, [a, *ours_cold]),
        "padded_tokens": padded_tokens(chunks, model, ragbench=padded),
        "topk_agreement": {
            "identical_lists": float(np.mean([x == y for x, y in zip(a, b, strict=True)])),
            "identical_sets": float(np.mean([set(x) == set(y) for x, y in zip(a, b, strict=True)])),
            "mean_overlap": float(
                np.mean([len(set(x) & set(y)) / K for x, y in zip(a, b, strict=True)])
            ),
        },
        "faiss_search_us": faiss_latency(warm, queries),
    }


def against_reference(chunks: list[Chunk], queries: list[str], runs: list) -> bool | None:
    """Whether every run's top-10 lists equal ragbench's from before token-length batching
    (``REFERENCE``); None for another corpus or other queries (``--quick``, the generated one)."""
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    if reference["queries"] != queries or reference["chunks"] != len(chunks):
        return None
    return all(ids == reference["top10"] for ids in runs)


def faiss_latency(dense, queries: list[str]) -> dict:
    """Search-only latency (query embeddings precomputed) for Flat and HNSW32 over the same vectors."""
    from ragbench.retrieval.faiss_index import FaissIndex

    q = dense.embedder.embed_queries(queries)
    vectors = dense.embedder.embed_documents([c.text for c in dense.chunks])  # cached
    out = {}
    for factory in ("Flat", "HNSW32"):
        index = dense.index if factory == "Flat" else FaissIndex(vectors.shape[1], factory)
        if factory != "Flat":
            index.add(vectors)
        index.search(q[:1], K)  # warm-up
        singles, batches = [], []
        for _ in range(3):  # repeats damp a loaded machine's noise
            for row in q:
                t = time.perf_counter()
                index.search(row[None, :], K)
                singles.append(time.perf_counter() - t)
            t = time.perf_counter()
            index.search(q, K)
            batches.append(time.perf_counter() - t)
        out[factory] = {
            "single_query_median_us": statistics.median(singles) * 1e6,
            "batched_per_query_us": min(batches) / len(q) * 1e6,
        }
    return out


def embedding_throughput(texts: list[str], model, cache_root: Path, repeats: int) -> dict:
    best = {"direct": 0.0, "ragbench_nocache": 0.0, "ragbench_cold_cache": 0.0}
    for r in range(repeats):  # alternate so machine load hits all three alike
        t = time.perf_counter()
        model.encode(texts, batch_size=BATCH_SIZE, normalize_embeddings=True)
        best["direct"] = max(best["direct"], len(texts) / (time.perf_counter() - t))
        emb = new_embedder(None)
        t = time.perf_counter()
        emb.embed_documents(texts)
        best["ragbench_nocache"] = max(
            best["ragbench_nocache"], len(texts) / (time.perf_counter() - t)
        )
        emb = new_embedder(cache_root / f"tp{r}")
        t = time.perf_counter()
        emb.embed_documents(texts)
        best["ragbench_cold_cache"] = max(
            best["ragbench_cold_cache"], len(texts) / (time.perf_counter() - t)
        )
    return {
        "texts": len(texts),
        "batch_size": BATCH_SIZE,
        "repeats": repeats,
        "direct_encode_texts_per_s": best["direct"],
        "ragbench_nocache_texts_per_s": best["ragbench_nocache"],
        "ragbench_cold_cache_texts_per_s": best["ragbench_cold_cache"],
        "ratio_nocache": best["ragbench_nocache"] / best["direct"],
        "ratio_cold_cache": best["ragbench_cold_cache"] / best["direct"],
    }


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def cpu_flags() -> list[str]:
    """The CPU's int8/bf16 matrix extensions (what int8 and bf16 kernels can use), from
    /proc/cpuinfo."""
    wanted = {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(wanted & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small corpora (a smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/retrieval.json")
    parser.add_argument("--queries", type=int, default=None, help="queries per corpus")
    parser.add_argument("--repeats", type=int, default=3, help="throughput repeats (best of)")
    parser.add_argument("--rounds", type=int, default=3, help="cold rounds on the essays (median)")
    parser.add_argument("--generated", type=int, default=None, help="generated corpus size")
    parser.add_argument(
        "--no-fast-embedders",
        "--no-onnx",
        dest="no_fast",
        action="store_true",
        help="skip the fast_embedders section (bf16, ONNX int8)",
    )
    args = parser.parse_args(argv)
    import sentence_transformers
    import torch

    n_queries = args.queries or (20 if args.quick else 100)
    # the model llama-index and direct encode() use: the same weights ragbench's embedder loads
    model = new_embedder(None).model
    t = time.perf_counter()
    essays = essay_chunks(limit=300 if args.quick else None)
    chunk_s = time.perf_counter() - t
    vocabulary = sorted({w for c in essays for w in c.text.split()})
    generated = generated_chunks(args.generated or (1000 if args.quick else 10_000), vocabulary)
    report: dict[str, Any] = {
        "meta": {
            "quick": args.quick,
            "batch_size": BATCH_SIZE,
            "k": K,
            "embedder": "all-MiniLM-L6-v2 (embedded), cpu",
            "cpu_model": cpu_name(),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(),
            "sentence_transformers": sentence_transformers.__version__,
            "onnxruntime": _version("onnxruntime"),
            "cpu_flags": cpu_flags(),
            "essay_chunking_s": chunk_s,
        },
        "corpora": {},
    }
    with tempfile.TemporaryDirectory(prefix="ragbench-bench-") as tmp:
        root = Path(tmp)
        queries = {}
        for name, chunks in (("essays", essays), ("generated", generated)):
            print(f"[bench] {name}: {len(chunks)} chunks ...", flush=True)
            queries[name] = make_queries(chunks, n_queries)
            rounds = args.rounds if name == "essays" else 1  # 10k chunks: minutes a side
            report["corpora"][name] = bench_corpus(
                chunks, queries[name], model, root / name, rounds
            )
            print(json.dumps(report["corpora"][name], indent=1), flush=True)
        essays_result = report["corpora"]["essays"]
        report["default_cold_speedup_vs_llamaindex"] = essays_result["speedup_cold"]
        report["default_top10_identical_to_llamaindex"] = (
            essays_result["topk_agreement"]["identical_lists"] == 1.0
            and essays_result["top10_cold_runs_identical"]
        )
        report["default_top10_identical_to_prefix"] = essays_result["top10_identical_to_prefix"]
        report["targets"] = {"default_cold_speedup_vs_llamaindex": 1.0}
        texts = [c.text for c in essays[: 128 if args.quick else 512]]
        report["embedding_throughput"] = embedding_throughput(texts, model, root, args.repeats)
        print(json.dumps(report["embedding_throughput"], indent=1))
        if not args.no_fast:
            from retrieval_fast import compare

            print("[bench] fast embedders (bf16, onnx) ...", flush=True)
            report["fast_embedders"] = compare(
                essays,
                queries["essays"],
                root / "essays",
                report["corpora"]["essays"],
                texts,
                model,
                BATCH_SIZE,
                args.repeats,
            )
            print(json.dumps(report["fast_embedders"], indent=1))
    report["meta"]["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    atomic_write_text(args.out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"[bench] wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
