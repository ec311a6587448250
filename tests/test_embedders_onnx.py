"""The ONNX Runtime embedder: names and errors (fast), vectors against PyTorch and the export
cache (slow: exports the embedded MiniLM once per test session, ~10 s)."""

from __future__ import annotations

import numpy as np
import pytest

from ragbench.registry import UnknownNameError
from ragbench.retrieval.embedders.base import get_embedder

DOCS = [
    "The cat sat on the warm mat by the fire.",
    "Stock markets fell sharply after the interest rate decision.",
    "A recipe for sourdough bread needs flour, water, salt and a starter, and some patience.",
    "Mars",
]
QUERIES = ["where did the cat sit", "what happened to stock markets", "sourdough bread recipe"]


def test_unknown_backend_and_quantization_name_the_choices():
    with pytest.raises(UnknownNameError, match="unknown embedder backend 'onxx'.*onnx, torch"):
        get_embedder("minilm", backend="onxx")
    with pytest.raises(UnknownNameError, match="ONNX quantization 'int4'.*valid: int8, int8-avx2"):
        get_embedder("minilm", backend="onnx", quantize="int4")
    with pytest.raises(ValueError, match="'hash' has no backend option"):
        get_embedder("hash", backend="onnx")
    with pytest.raises(ValueError, match="runs on ONNX Runtime, not backend='torch'"):
        get_embedder("minilm-onnx", backend="torch")
    with pytest.raises(UnknownNameError, match="did you mean 'minilm-onnx-int8'"):
        get_embedder("minilm-onnx-int9")


def test_missing_onnxruntime_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name)
    )
    with pytest.raises(ImportError, match="needs onnxruntime: pip install"):
        get_embedder("minilm-onnx-int8")


def test_backend_and_quantization_are_part_of_the_identity(tmp_path):
    torch_emb = get_embedder("minilm", cache_dir=tmp_path)
    fp32 = get_embedder("minilm-onnx", cache_dir=tmp_path)
    int8 = get_embedder("minilm-onnx-int8", cache_dir=tmp_path)
    same = get_embedder("minilm", backend="onnx", quantize="int8", cache_dir=tmp_path)
    ids = {torch_emb.model_identity, fp32.model_identity, int8.model_identity}
    assert len(ids) == 3 and same.model_identity == int8.model_identity
    assert "quantize=int8:" in int8.model_identity and int8._model is None  # not loaded
    assert '"reduce_range":false' in int8.model_identity  # its settings, not only its name
    assert int8.cache.dir != torch_emb.cache.dir  # cached vectors never mix
    assert fp32.export_key() != int8.export_key()


def test_config_takes_the_onnx_embedder_both_ways():
    from ragbench.experiment.config.sections import RetrievalConfig

    RetrievalConfig(embedder=["minilm", "minilm-onnx-int8"])
    cfg = RetrievalConfig(embedder="minilm", embedder_params={"minilm": {"backend": "onnx"}})
    assert cfg.embedder_params["minilm"] == {"backend": "onnx"}


# ---------------------------------------------------------------- real exports (slow)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def reference():
    emb = get_embedder("minilm", cache=False, device="cpu")
    return emb.embed_documents(DOCS), emb.embed_queries(QUERIES)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "bound"), [("minilm-onnx", 0.99), ("minilm-onnx-int8", 0.97)])
def test_onnx_vectors_match_torch(name, bound, export_dir, reference):
    emb = get_embedder(name, cache=False, export_dir=export_dir)
    docs, queries = emb.embed_documents(DOCS), emb.embed_queries(QUERIES)
    for got, want in ((docs, reference[0]), (queries, reference[1])):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosine = (got * want).sum(axis=1)
        assert cosine.min() >= bound, cosine
    assert (queries @ docs.T).argmax(axis=1).tolist() == [0, 1, 2]
    if name == "minilm-onnx":  # fp32 ONNX is the same computation
        np.testing.assert_allclose(docs, reference[0], atol=1e-4)


@pytest.mark.slow
def test_export_is_cached_and_reused(export_dir):
    import ragbench.retrieval.embedders.onnx as onnx_module

    first = get_embedder("minilm-onnx-int8", cache=False, export_dir=export_dir)
    assert first.model is not None
    path = first.onnx_path()
    stamp, exports = path.stat().st_mtime_ns, onnx_module.exports
    # the same model through the backend/quantize options: the same export, not a second one
    again = get_embedder("minilm", backend="onnx", quantize="int8", export_dir=export_dir)
    assert again.model is not None
    assert not again.exported and onnx_module.exports == exports
    assert again.onnx_path() == path and path.stat().st_mtime_ns == stamp
    assert not [p for p in export_dir.iterdir() if p.name.startswith(".")]  # no temp folders
