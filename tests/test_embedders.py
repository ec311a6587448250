"""Embedders: normalised float32 vectors, prefixes, the on-disk cache, the real MiniLM (slow)."""

from __future__ import annotations

import json
import multiprocessing as mp

import numpy as np
import pytest

from ragbench.registry import UnknownNameError
from ragbench.retrieval.embedders.base import (
    HashEmbedder,
    SentenceTransformerEmbedder,
    get_embedder,
    l2_normalise,
    length_batches,
    token_lengths,
)
from ragbench.retrieval.embedders.cache import EmbeddingCache

DOCS = [
    "The cat sat on the warm mat by the fire.",
    "Stock markets fell sharply after the interest rate decision.",
    "A recipe for sourdough bread needs flour, water, salt and a starter.",
    "The spacecraft entered orbit around Mars after a seven month journey.",
]
QUERIES = ["where did the cat sit", "what happened to stock markets", "sourdough bread recipe"]


def assert_unit_float32(x: np.ndarray, n: int, dim: int) -> None:
    assert x.dtype == np.float32 and x.shape == (n, dim)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)


def test_hash_embedder_is_deterministic_normalised_and_retrieves():
    a, b = HashEmbedder(dim=128, seed=3), HashEmbedder(dim=128, seed=3)
    docs = a.embed_documents(DOCS)
    assert_unit_float32(docs, len(DOCS), 128)
    np.testing.assert_array_equal(docs, b.embed_documents(DOCS))
    assert not np.array_equal(docs, HashEmbedder(dim=128, seed=4).embed_documents(DOCS))
    best = (a.embed_queries(QUERIES) @ docs.T).argmax(axis=1)
    assert best.tolist() == [0, 1, 2]
    assert a.embed_documents([]).shape == (0, 128)


def test_prefixes_change_vectors_and_identity():
    plain = HashEmbedder()
    prefixed = HashEmbedder(query_prefix="query: ", document_prefix="passage: ")
    q, d = prefixed.embed_queries(["cats"]), prefixed.embed_documents(["cats"])
    assert not np.allclose(q, d)
    np.testing.assert_array_equal(plain.embed_queries(["cats"]), plain.embed_documents(["cats"]))
    np.testing.assert_array_equal(q, plain.embed_documents(["query: cats"]))
    assert plain.identity() != prefixed.identity()
    assert plain.model_identity == prefixed.model_identity


def test_bad_input():
    emb = HashEmbedder()
    with pytest.raises(TypeError, match="not a single string"):
        emb.embed_queries("a query")
    with pytest.raises(ValueError, match="empty query at position 1"):
        emb.embed_queries(["ok", "  "])
    with pytest.raises(TypeError, match="document at position 0 is int"):
        emb.embed_documents([3])
    with pytest.raises(UnknownNameError, match="did you mean 'minilm'"):
        get_embedder("minlm")
    assert isinstance(get_embedder("hash", dim=64), HashEmbedder)
    zero = l2_normalise(np.zeros((1, 4)))
    assert zero.dtype == np.float32 and not zero.any()


def test_cache_serves_hits_without_calling_the_model(tmp_path):
    emb = HashEmbedder(dim=64, cache_dir=tmp_path)
    first = emb.embed_documents(DOCS)
    assert emb.encode_calls == 1
    again = HashEmbedder(dim=64, cache_dir=tmp_path)  # a new process would start like this
    np.testing.assert_array_equal(again.embed_documents(DOCS[::-1]), first[::-1])
    assert again.encode_calls == 0 and again.cache.hits == len(DOCS)
    # only the new text is embedded, duplicates in a batch are embedded once
    out = again.embed_documents([DOCS[0], "a brand new text", "a brand new text"])
    assert again.encode_calls == 1 and again.cache.misses == 1
    np.testing.assert_array_equal(out[1], out[2])
    # a query with the same text but a prefix is a different model input: not served from docs
    pre = HashEmbedder(dim=64, query_prefix="q: ", cache_dir=tmp_path)
    pre.embed_queries([DOCS[0]])
    assert pre.encode_calls == 1


def test_cache_never_serves_another_model_or_a_corrupted_shard(tmp_path):
    HashEmbedder(dim=64, seed=0, cache_dir=tmp_path).embed_documents(DOCS)
    other = HashEmbedder(dim=64, seed=1, cache_dir=tmp_path)
    other.embed_documents(DOCS)
    assert other.encode_calls == 1  # different model identity, different folder
    # tamper with a shard: copy seed 0's index into seed 1's folder under a forged model name
    cache0 = EmbeddingCache(tmp_path, HashEmbedder(dim=64, seed=0).model_identity)
    cache1 = EmbeddingCache(tmp_path, other.model_identity)
    index_path = next(cache0.dir.glob("*.json"))
    forged = cache1.dir / "forged.json"
    forged.write_text(index_path.read_text())
    (cache1.dir / "forged.npy").write_bytes(index_path.with_suffix(".npy").read_bytes())
    cache1.refresh()  # names the wrong model: skipped
    assert len(cache1) == len(DOCS)
    # flip bytes of a vector file: its sha256 no longer matches, the shard is ignored
    npy = next(cache0.dir.glob("*.npy"))
    data = bytearray(npy.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"
    npy.write_bytes(bytes(data))
    fresh = HashEmbedder(dim=64, seed=0, cache_dir=tmp_path)
    vectors = fresh.embed_documents(DOCS)
    assert fresh.encode_calls == 1 and np.isfinite(vectors).all()
    index = json.loads(index_path.read_text())
    assert index["model"] == fresh.model_identity and len(index["keys"]) == len(DOCS)


def _embed_in_child(path: str, texts: list[str]) -> None:
    HashEmbedder(dim=32, cache_dir=path).embed_documents(texts)


def test_concurrent_writers_do_not_clash(tmp_path):
    ctx = mp.get_context("spawn")
    texts = [f"text number {i}" for i in range(50)]
    procs = [ctx.Process(target=_embed_in_child, args=(str(tmp_path), texts)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    reader = HashEmbedder(dim=32, cache_dir=tmp_path)
    np.testing.assert_array_equal(
        reader.embed_documents(texts), HashEmbedder(dim=32).embed_documents(texts)
    )
    assert reader.encode_calls == 0
    assert not list(reader.cache.dir.glob("*.tmp"))


# ---------------------------------------------------------------- the real embedded MiniLM


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    return SentenceTransformerEmbedder(cache_dir=tmp_path_factory.mktemp("emb"), device="cpu")


@pytest.mark.slow
def test_minilm_vectors_cache_and_prefixes(minilm, tmp_path):
    docs = minilm.embed_documents(DOCS)
    assert_unit_float32(docs, len(DOCS), 384)
    assert minilm.dim == 384 and minilm.encode_calls == 1
    assert minilm.model_identity.startswith("sentence-transformers:all-MiniLM-L6-v2@sha256:")
    best = (minilm.embed_queries(QUERIES) @ docs.T).argmax(axis=1)
    assert best.tolist() == [0, 1, 2]
    # a second embedder on the same cache never calls the model
    again = SentenceTransformerEmbedder(cache_dir=minilm.cache_dir, device="cpu")
    np.testing.assert_array_equal(again.embed_documents(DOCS), docs)
    assert again.encode_calls == 0 and again._model is None  # not even loaded
    # equal to calling sentence-transformers directly, same batch size
    direct = minilm.model.encode(DOCS, batch_size=64, normalize_embeddings=True)
    np.testing.assert_allclose(docs, direct, atol=1e-6)
    # query vs document prefixes give different vectors for the same text
    e5 = SentenceTransformerEmbedder(
        query_prefix="query: ", document_prefix="passage: ", cache=False, device="cpu"
    )
    e5._model = minilm.model  # share the loaded weights
    q, d = e5.embed_queries([DOCS[0]]), e5.embed_documents([DOCS[0]])
    assert float((q @ d.T)[0, 0]) < 0.999 and e5.cache is None
    assert e5.identity() != minilm.identity()


def test_length_batches_group_by_length_longest_first_ties_by_position():
    lengths = [3, 9, 9, 1, 5, 3]
    batches = length_batches(lengths, 2)
    assert batches == [[1, 2], [4, 0], [5, 3]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert length_batches([], 4) == [] and length_batches([7], 4) == [[0]]
    # padding of sorted batches is minimal: each batch pads to its own longest
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded == 2 * 9 + 2 * 5 + 2 * 3 < 6 * 9


def padded(lengths: list[int], order: list[int], batch_size: int) -> int:
    return sum(
        len(order[s : s + batch_size]) * max(lengths[i] for i in order[s : s + batch_size])
        for s in range(0, len(order), batch_size)
    )


@pytest.mark.slow
def test_minilm_batches_by_tokens_not_characters(minilm):
    # digits are a token each (many tokens, few characters), a long common word is one token
    # (few tokens, many characters): characters order these 59, 55, 43, 41 (tokens 32, 6, 24,
    # 5), so sorting by characters pairs a long text with a short one in every batch
    digits = [" ".join(str(d % 10) for d in range(n)) for n in (30, 22)]
    words = [" ".join(["understanding"] * m) for m in (4, 3)]
    texts = [t for pair in zip(digits, words, strict=True) for t in pair]
    emb = SentenceTransformerEmbedder(batch_size=2, cache=False, device="cpu")
    emb._model = minilm.model  # share the loaded weights
    vectors = emb.embed_documents(texts)
    lengths = token_lengths(emb.model, texts)
    by_tokens = [i for b in length_batches(lengths, 2) for i in b]
    by_chars = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # sentence-transformers'
    assert emb.padded_tokens == padded(lengths, by_tokens, 2) < padded(lengths, by_chars, 2)
    # the same vectors, in input order, as one encode call over all texts
    direct = emb.model.encode(texts, batch_size=2, normalize_embeddings=True)
    np.testing.assert_allclose(vectors, direct, atol=1e-6)
    assert_unit_float32(vectors, len(texts), 384)


def test_server_embeddings_equal_local_ones_and_are_cached(tmp_path, monkeypatch):
    # a loopback /v1/embeddings server that answers with the hash embedder's vectors: a run
    # through it must retrieve exactly what the local hash embedder retrieves
    import json as _json

    from openai_server import send_json, serving
    from test_runner import niah_config

    from ragbench.experiment.runner import run
    from ragbench.retrieval.embedders.base import HashEmbedder

    monkeypatch.setenv("RAGBENCH_CACHE", str(tmp_path / "cache"))
    local = HashEmbedder()

    def embeddings(h, body, n):
        vectors = local._encode(list(body["input"]))
        data = [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        send_json(h, 200, {"object": "list", "data": data[::-1], "model": body["model"]})

    gen = serving()
    srv = next(gen)(embeddings)
    try:
        cfg = niah_config(tmp_path, strategies=[{"name": "rag", "params": {"top_k": 2}}])
        expected = run(cfg, progress=False)
        cfg["output_dir"] = str(tmp_path / "served")
        cfg["retrieval"] |= {
            "embedder": "openai",
            "embedder_params": {
                "openai": {
                    "model": "emb",
                    "base_url": srv.url,
                    "api_key": "k-EMB-123456",
                    "batch_size": 7,
                },
            },
        }
        served = run(cfg, progress=False)
        sent = len(srv.requests)
        assert sent > 1 and all(len(r[2]["input"]) <= 7 for r in srv.requests)
        assert srv.requests[0][1]["Authorization"] == "Bearer k-EMB-123456"
        assert served["retrieved"].tolist() == expected["retrieved"].tolist()
        cfg["output_dir"] = str(tmp_path / "again")
        run(cfg, progress=False)
        assert len(srv.requests) == sent  # every vector came from the cache
        manifest = next((tmp_path / "served").rglob("manifest.json")).read_text()
        assert (
            "k-EMB-123456" not in manifest
            and "emb"
            in _json.loads(manifest)["config"]["retrieval"]["embedder_params"]["openai"]["model"]
        )
    finally:
        next(gen, None)


def test_a_failing_embeddings_server_is_named_in_the_error(tmp_path):
    # the error names the embeddings URL it called (not the chat-completions one), without the key
    from openai_server import send_json, serving

    from ragbench.llm.openai.http import LLMRequestError
    from ragbench.retrieval.embedders.http import OpenAIEmbedder

    def broken(h, body, n):
        send_json(h, 400, {"error": {"message": "no such model"}})

    gen = serving()
    srv = next(gen)(broken)
    try:
        emb = OpenAIEmbedder("emb", base_url=srv.url, api_key="k-EMB-654321", cache_dir=None)
        with pytest.raises(LLMRequestError) as err:
            emb.embed_documents(["a text"])
        assert "/embeddings" in str(err.value) and "chat/completions" not in str(err.value)
        assert "k-EMB-654321" not in str(err.value)
    finally:
        next(gen, None)
