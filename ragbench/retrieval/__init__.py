"""Retrieval: chunking, embedders, FAISS indexes, retrievers, context assembly and metrics.

The names a setting can take (``RETRIEVERS``, ``EMBEDDERS``, ``SPLITTERS``), the checks the
config runs before any model loads (``check_retriever_params``, ``check_chunking``) and
``build_index`` (settings -> chunks + retriever) are importable from here; importing this
package loads no faiss, torch, transformers or llama-index.
"""

from __future__ import annotations

from ragbench.retrieval.build import (
    build_index,
    build_retriever,
    check_retriever_params,
    needs_embedder,
    retriever_options,
)
from ragbench.retrieval.chunking import check_chunking
from ragbench.retrieval.names import EMBEDDERS, RETRIEVERS, SPLITTERS

__all__ = [
    "EMBEDDERS",
    "RETRIEVERS",
    "SPLITTERS",
    "build_index",
    "build_retriever",
    "check_chunking",
    "check_retriever_params",
    "needs_embedder",
    "retriever_options",
]
