"""The ONNX Runtime int8 embedder against PyTorch fp32 and llama-index (part of
``benchmarks/retrieval.py``; its ``onnx`` section).

- ``embed_speedup_vs_torch``: texts/s of ragbench's ``minilm-onnx-int8`` ``embed_documents``
  (embedding cache off) over a plain ``model.encode(texts, batch_size=64,
  normalize_embeddings=True)`` on the same fp32 PyTorch model and texts, best of ``repeats``
  alternating runs. ``fp32_onnx_texts_per_s`` and ``direct_encode_1thread_texts_per_s`` are
  context (the latter shows how much of a gap is the machine's load rather than int8);
- ``top10_overlap``: mean |A∩B|/10 of the top-10 chunk lists of the int8 index and the fp32
  PyTorch index over the essay corpus and queries of the main benchmark;
- ``cold_speedup_vs_llamaindex``: llama-index ``VectorStoreIndex`` end-to-end time (build +
  queries, fp32 PyTorch, from the essays section of the same run) over ragbench's cold
  end-to-end time (empty embedding cache: embed + index + one batch of queries) with the int8
  embedder. The one-time export and model loading are outside the timed section, as model
  loading is for both sides.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

K = 10


def onnx_embedder(name: str, cache_root: Path | None, batch_size: int):
    """A loaded (exported once, cached) ONNX embedder with its identity hashed."""
    from ragbench.retrieval.embedders import get_embedder

    emb = get_embedder(
        name, batch_size=batch_size, cache_dir=cache_root, cache=cache_root is not None
    )
    emb.model, emb.identity()
    return emb


def throughput(texts: list[str], model, batch_size: int, repeats: int) -> dict:
    import torch

    int8 = onnx_embedder("minilm-onnx-int8", None, batch_size)
    fp32 = onnx_embedder("minilm-onnx", None, batch_size)
    best = {"direct": 0.0, "int8": 0.0, "fp32_onnx": 0.0, "direct_1thread": 0.0}

    def timed(key: str, fn) -> None:
        t = time.perf_counter()
        fn()
        best[key] = max(best[key], len(texts) / (time.perf_counter() - t))

    threads = torch.get_num_threads()
    for _ in range(repeats):  # alternate so machine load hits all of them alike
        timed(
            "direct", lambda: model.encode(texts, batch_size=batch_size, normalize_embeddings=True)
        )
        timed("int8", lambda: int8.embed_documents(texts))
        timed("fp32_onnx", lambda: fp32.embed_documents(texts))
        torch.set_num_threads(1)
        try:
            timed(
                "direct_1thread",
                lambda: model.encode(texts, batch_size=batch_size, normalize_embeddings=True),
            )
        finally:
            torch.set_num_threads(threads)
    return {
        "texts": len(texts),
        "batch_size": batch_size,
        "repeats": repeats,
        "direct_encode_texts_per_s": best["direct"],
        "onnx_int8_texts_per_s": best["int8"],
        "fp32_onnx_texts_per_s": best["fp32_onnx"],
        "direct_encode_1thread_texts_per_s": best["direct_1thread"],
        "torch_threads": threads,
        "onnx_threads": "onnxruntime default (physical cores), no spinning",
    }


def compare(
    chunks, queries, cache_root: Path, essays_result: dict, texts, model, batch_size, repeats
) -> dict:
    """The ``onnx`` section; ``cache_root`` holds the fp32 vectors of ``chunks`` already
    (the main benchmark's essays cache), ``essays_result`` its essays section."""
    from ragbench.retrieval.embedders import SentenceTransformerEmbedder
    from ragbench.retrieval.retrievers import DenseRetriever

    load_before = os.getloadavg()
    emb = onnx_embedder("minilm-onnx-int8", cache_root / "onnx-int8-cold", batch_size)
    t = time.perf_counter()
    int8_index = DenseRetriever(chunks, emb)
    build = time.perf_counter() - t
    t = time.perf_counter()
    ours = int8_index.retrieve(queries, K)
    query = time.perf_counter() - t

    fp32 = SentenceTransformerEmbedder(None, "cpu", batch_size, cache_dir=cache_root)
    fp32._model = model  # same weights; its vectors come from the main benchmark's cache
    reference = DenseRetriever(chunks, fp32).retrieve(queries, K)
    a = [[h.chunk.id for h in r] for r in ours]
    b = [[h.chunk.id for h in r] for r in reference]
    overlap = [len(set(x) & set(y)) / K for x, y in zip(a, b, strict=True)]

    tp = throughput(texts, model, batch_size, repeats)
    li = essays_result["llamaindex"]["end_to_end_s"]
    return {
        "embed_speedup_vs_torch": tp["onnx_int8_texts_per_s"] / tp["direct_encode_texts_per_s"],
        "top10_overlap": float(np.mean(overlap)),
        "cold_speedup_vs_llamaindex": li / (build + query),
        "embedder": emb.model_identity,
        "onnx_file": str(emb.onnx_path().name),
        "top10_identical_lists": float(np.mean([x == y for x, y in zip(a, b, strict=True)])),
        "top10_overlap_min": float(np.min(overlap)),
        "essays": {
            "chunks": len(chunks),
            "queries": len(queries),
            "ragbench_int8_build_cold_s": build,
            "ragbench_int8_query_cold_s": query,
            "ragbench_int8_end_to_end_cold_s": build + query,
            "ragbench_fp32_end_to_end_cold_s": essays_result["ragbench"]["end_to_end_cold_s"],
            "llamaindex_end_to_end_s": li,
        },
        "embedding_throughput": tp,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
