"""bf16 precision of the PyTorch embedder: names, identities and errors (fast); vectors against
fp32 and the embedding cache (slow: loads the embedded MiniLM)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import ragbench.retrieval.embedders.precision as precision
from ragbench.registry import UnknownNameError
from ragbench.retrieval.embedders.base import (
    Bf16Embedder,
    SentenceTransformerEmbedder,
    folder_fingerprint,
    get_embedder,
)

QUERIES = ["what makes a startup grow", "how to find good ideas", "why do people procrastinate"]


def essay_paragraphs(n: int = 6) -> list[str]:
    """The first ``n`` substantial paragraphs of the embedded essays (real prose, ~100 words)."""
    from ragbench.assets import essays_dir

    out = []
    for path in sorted(essays_dir().glob("*.txt")):
        for para in path.read_text(encoding="utf-8").split("\n\n"):
            words = para.split()
            if len(words) >= 40:
                out.append(" ".join(words[:120]))
            if len(out) == n:
                return out
    return out


def test_precision_is_part_of_the_identity_and_fp32_is_unchanged(tmp_path):
    from ragbench.assets import minilm_dir

    fp32 = SentenceTransformerEmbedder(cache_dir=tmp_path, device="cpu")
    bf16 = get_embedder("minilm-bf16", cache_dir=tmp_path, device="cpu")
    full = get_embedder("minilm", precision="bf16-full", cache_dir=tmp_path, device="cpu")
    # the identity before precisions existed: caches and indexes built then stay valid
    before = (
        f"sentence-transformers:all-MiniLM-L6-v2@sha256:{folder_fingerprint(minilm_dir())[:16]}"
    )
    assert fp32.model_identity == before
    assert get_embedder("minilm", precision="fp32", cache_dir=tmp_path).model_identity == before
    assert bf16.model_identity == before + "|precision=bf16"
    assert full.model_identity == before + "|precision=bf16-full"
    assert len({fp32.identity(), bf16.identity(), full.identity()}) == 3
    assert len({fp32.cache.dir, bf16.cache.dir, full.cache.dir}) == 3  # vectors never mix
    assert isinstance(bf16, Bf16Embedder) and bf16.precision == "bf16"
    assert bf16._model is None and full._model is None  # identities load no model
    assert get_embedder("MiniLM-BF16", cache=False).precision == "bf16"


def test_unknown_precision_names_the_choices():
    with pytest.raises(UnknownNameError, match="precision 'fp16'.*valid: bf16, bf16-full, fp32"):
        get_embedder("minilm", precision="fp16", cache=False)
    with pytest.raises(UnknownNameError, match="valid: bf16, bf16-full, fp32"):
        get_embedder("minilm-bf16", precision="int8", cache=False)
    with pytest.raises(UnknownNameError, match="did you mean 'minilm-bf16'"):
        get_embedder("minilm-bf61")


def test_onnx_takes_no_bf16():
    with pytest.raises(
        ValueError, match="takes quantize \\(none, int8, int8-avx2\\), not precision"
    ):
        get_embedder("minilm-onnx", precision="bf16", cache=False)
    with pytest.raises(
        ValueError, match="'minilm-bf16' runs on PyTorch in bf16, not backend='onnx'"
    ):
        get_embedder("minilm-bf16", backend="onnx")
    with pytest.raises(ValueError, match="not backend='onnx'"):
        get_embedder("minilm-bf16", quantize="int8")
    assert get_embedder("minilm-onnx", precision="fp32", cache=False).precision == "fp32"


def test_config_checks_precision_before_any_model_loads():
    from pydantic import ValidationError

    from ragbench.experiment.config.sections import RetrievalConfig

    RetrievalConfig(embedder="minilm-bf16")
    ok = RetrievalConfig(embedder="minilm", embedder_params={"minilm": {"precision": "bf16-full"}})
    assert ok.embedder_params["minilm"] == {"precision": "bf16-full"}
    bad = {
        "minilm": ({"precision": "bf17"}, "unknown embedder precision 'bf17'; did you mean 'bf16'"),
        "hash": ({"precision": "bf16"}, "'hash' has no precision option"),
        "minilm-onnx-int8": ({"precision": "bf16"}, "runs on ONNX Runtime"),
    }
    for name, (params, message) in bad.items():
        with pytest.raises(ValidationError, match=message):
            RetrievalConfig(embedder=name, embedder_params={name: params})
    with pytest.raises(ValidationError, match="runs on ONNX Runtime"):
        RetrievalConfig(
            embedder="minilm", embedder_params={"minilm": {"backend": "onnx", "precision": "bf16"}}
        )


def test_emulated_bf16_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(precision, "bf16_native", lambda device="cpu": False)
    monkeypatch.setattr(precision, "_bf16_warned", set())
    monkeypatch.setattr(precision, "_cpu_features", lambda: {"avx2"})  # no VNNI either
    with caplog.at_level(logging.WARNING, logger="ragbench.retrieval.embedders.precision"):
        precision.warn_if_bf16_emulated("cpu")
        precision.warn_if_bf16_emulated("cpu")
    assert len(caplog.records) == 1
    assert "slower than fp32" in caplog.text and "minilm-onnx-int8" in caplog.text
    assert "int8-avx2" in caplog.text  # the 7-bit setting, which does not saturate without VNNI
    monkeypatch.setattr(precision, "bf16_native", lambda device="cpu": True)
    monkeypatch.setattr(precision, "_bf16_warned", set())
    caplog.clear()
    precision.warn_if_bf16_emulated("cpu")
    assert not caplog.records


def test_bf16_native_agrees_with_the_cpu_flags():
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the flags checked here are x86's")
    flags = precision._cpu_features()
    assert precision.bf16_native("cpu") == bool({"amx_bf16", "avx512_bf16"} & flags)


# ---------------------------------------------------------------- the real model (slow)


@pytest.fixture(scope="module")
def texts():
    paragraphs = essay_paragraphs()
    assert len(paragraphs) == 6
    return paragraphs


@pytest.fixture(scope="module")
def reference(texts):
    emb = SentenceTransformerEmbedder(cache=False, device="cpu")
    return emb, emb.embed_documents(texts), emb.embed_queries(QUERIES)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "bf16-full"])
def test_bf16_vectors_match_fp32(precision, texts, reference):
    emb = SentenceTransformerEmbedder(cache=False, device="cpu", precision=precision)
    docs, queries = emb.embed_documents(texts), emb.embed_queries(QUERIES)
    _, ref_docs, ref_queries = reference
    for got, want in ((docs, ref_docs), (queries, ref_queries)):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosine = (got * want).sum(axis=1)
        assert cosine.min() > 0.999, cosine  # measured >= 0.99995 (ONNX int8: ~0.993)
        assert np.abs(got - want).max() > 1e-5  # bf16 really ran: not the fp32 computation
    weights = next(emb.model.parameters()).dtype
    assert str(weights) == ("torch.bfloat16" if precision == "bf16-full" else "torch.float32")
    # the same nearest essay paragraph for each query as fp32
    assert (queries @ docs.T).argmax(axis=1).tolist() == (ref_queries @ ref_docs.T).argmax(
        axis=1
    ).tolist()


@pytest.mark.slow
def test_cache_never_serves_one_precision_for_another(texts, reference, tmp_path):
    fp32_model = reference[0].model
    fp32 = SentenceTransformerEmbedder(cache_dir=tmp_path, device="cpu")
    fp32._model = fp32_model  # share the loaded weights
    fp32_vectors = fp32.embed_documents(texts)
    assert fp32.encode_calls == 1
    bf16 = get_embedder("minilm-bf16", cache_dir=tmp_path, device="cpu")
    bf16_vectors = bf16.embed_documents(texts)
    assert bf16.encode_calls == 1  # re-encoded: the fp32 vectors in the same folder not served
    assert not np.array_equal(bf16_vectors, fp32_vectors)
    full = get_embedder("minilm", precision="bf16-full", cache_dir=tmp_path, device="cpu")
    full.embed_documents(texts)
    assert full.encode_calls == 1
    # each precision is then served from its own cache, without loading a model
    for name, params, want in (
        ("minilm", {}, fp32_vectors),
        ("minilm-bf16", {}, bf16_vectors),
        ("minilm", {"precision": "bf16"}, bf16_vectors),
    ):
        again = get_embedder(name, cache_dir=tmp_path, device="cpu", **params)
        np.testing.assert_array_equal(again.embed_documents(texts), want)
        assert again.encode_calls == 0 and again._model is None
