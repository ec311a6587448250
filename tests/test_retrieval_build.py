"""Retrieval settings: the name registries, the checks run before any model loads, build_index."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragbench.registry import Registry, UnknownNameError
from ragbench.retrieval import (
    EMBEDDERS,
    RETRIEVERS,
    SPLITTERS,
    build_index,
    check_chunking,
    check_retriever_params,
)
from ragbench.retrieval.chunking import chunk_documents
from ragbench.retrieval.retrievers import BM25Retriever, DenseRetriever, HybridRetriever
from ragbench.tokenizers import check_tokenizer
from ragbench.types import Document

DOCS = [
    Document("lisbon", "The magic number for Lisbon is 7463343. Lisbon lies on the Tagus river."),
    Document("oslo", "The magic number for Oslo is 1200450. Oslo lies at the head of a fjord."),
]
SETTINGS = dict(splitter="sentence", chunk_size=8, chunk_overlap=2, tokenizer="whitespace")


# ---------------------------------------------------------------------------- registries


def test_registry_iterates_names_and_lists_other_choices():
    reg = Registry("thing", {"b": "x:y", "a": "x:z"}, other="<path>", accepts=lambda n: "/" in n)
    assert list(reg) == reg.names() == ["a", "b"] and len(reg) == 2
    assert reg.check("a") == "a" and reg.check("some/path") == "some/path"
    assert "some/path" not in reg
    with pytest.raises(UnknownNameError, match=r"unknown thing 'c'; valid: <path>, a, b"):
        reg.check("c")
    with pytest.raises(UnknownNameError, match="unknown thing 'some/path'"):
        reg.get("some/path")  # accepted by check, but not an entry to load


def test_setting_names_are_registries():
    assert list(RETRIEVERS) == ["bm25", "dense", "hybrid", "rerank"]
    assert list(SPLITTERS) == ["sentence", "token"]
    assert {"minilm", "hash"} <= set(EMBEDDERS)


def test_embedder_names_accept_any_case_folders_and_hub_ids(tmp_path):
    for name in ("MiniLM", "hash", "org/model", str(tmp_path)):
        assert EMBEDDERS.check(name) == name
    with pytest.raises(UnknownNameError, match="unknown embedder 'hsh'; did you mean 'hash'"):
        EMBEDDERS.check("hsh")


def test_check_tokenizer_accepts_what_get_tokenizer_does(tmp_path):
    for name in ("whitespace", "smollm2-135m-instruct", str(tmp_path), "tok/folder", "m.gguf"):
        assert check_tokenizer(name) == name
    with pytest.raises(UnknownNameError, match="did you mean 'whitespace'.*smollm2-135m-instruct"):
        check_tokenizer("whitespac")


# ---------------------------------------------------------------------------- checks


def test_unknown_retriever_says_did_you_mean():
    with pytest.raises(UnknownNameError, match="unknown retriever 'dnese'; did you mean 'dense'"):
        check_retriever_params("dnese", {})


def test_unknown_retriever_param_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"retriever 'bm25': .*'k_1'; did you mean 'k1'.*method"):
        check_retriever_params("bm25", {"k_1": 1.2})
    with pytest.raises(ValueError, match=r"'weights'.*valid: b, factory"):
        check_retriever_params("dense", {"weights": [1, 1]})  # fusion is hybrid's and rerank's
    with pytest.raises(ValueError, match="embedder is a setting of its own"):
        check_retriever_params("dense", {"embedder": "hash"})
    check_retriever_params("rerank", {"batch_size": 8})  # keys one by one: build_index says
    check_retriever_params("hybrid", {"weights": [1.0, 0.5], "rrf_k": 30, "method": "bm25+"})
    check_retriever_params("bm25", {"factory": "HNSW32"})  # dense options are shared by all
    check_retriever_params("rerank", {"cross_encoder": "ce", "base": "dense", "candidates": 9})


def test_chunking_checks():
    check_chunking("token", 128, 16)
    with pytest.raises(ValueError, match=r"chunk_overlap must be in \[0, chunk_size=64\), got 64"):
        check_chunking("sentence", 64, 64)
    with pytest.raises(ValueError, match=r"chunk_overlap must be in \[0, chunk_size=8\), got 9"):
        check_chunking("sentence", 8, 9)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        check_chunking("sentence", 0, 0)
    with pytest.raises(UnknownNameError, match="did you mean 'sentence'.*valid: sentence, token"):
        check_chunking("sentense", 128, 16)


# ---------------------------------------------------------------------------- build_index


def test_build_index_chunks_then_builds_the_named_retriever():
    chunks, dense = build_index(DOCS, retriever="dense", embedder="hash", **SETTINGS)
    assert chunks == chunk_documents(DOCS, "sentence", 8, 2, "whitespace")
    assert isinstance(dense, DenseRetriever) and dense.chunks == chunks
    assert dense.retrieve(["magic number for Oslo"], 1)[0][0].chunk.doc_id == "oslo"
    _, bm25 = build_index(DOCS, retriever="bm25", embedder="hash", **SETTINGS)
    assert isinstance(bm25, BM25Retriever)  # the embedder is not needed, and not loaded
    _, hybrid = build_index(
        DOCS, retriever="hybrid", embedder="hash", retriever_params={"rrf_k": 5}, **SETTINGS
    )
    assert isinstance(hybrid, HybridRetriever) and hybrid.rrf_k == 5


def test_build_index_checks_every_setting_before_chunking():
    # an empty corpus would fail in chunking: each bad setting is reported first
    bad = [
        ({"retriever": "dnese"}, "did you mean 'dense'"),
        ({"retriever_params": {"colour": 1}}, "unexpected option 'colour'"),
        ({"retriever": "rerank"}, "needs cross_encoder"),  # ...that rerank needs one
        ({"splitter": "sentense"}, "did you mean 'sentence'"),
        ({"chunk_overlap": 8}, "chunk_overlap must be"),
        ({"tokenizer": "whitespac"}, "did you mean 'whitespace'"),
        ({"embedder": "hsh"}, "did you mean 'hash'"),
    ]
    for change, message in bad:
        kw = {"retriever": "dense", "embedder": "hash", **SETTINGS, **change}
        with pytest.raises(ValueError, match=message):
            build_index([], **kw)


def test_registries_and_checks_import_nothing_heavy():
    code = (
        "import sys, ragbench, ragbench.retrieval as r, ragbench.metrics.answer, ragbench.tokenizers,"
        " ragbench.datasets.formats\n"
        "r.check_retriever_params('hybrid', {'weights': [1, 1]})\n"
        "r.check_chunking('sentence', 128, 16); r.EMBEDDERS.check('minilm')\n"
        "ragbench.tokenizers.check_tokenizer('whitespace')\n"
        "heavy = ('torch', 'faiss', 'transformers', 'sentence_transformers', 'llama_index')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
