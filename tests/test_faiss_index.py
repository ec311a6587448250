"""FaissIndex: reference equality with brute-force numpy, HNSW/IVF recall, save/load checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from faiss.contrib.datasets import SyntheticDataset

from ragbench.registry import UnknownNameError
from ragbench.retrieval.embedders.base import l2_normalise
from ragbench.retrieval.faiss_index import CorruptIndexError, FaissIndex, IndexCompatibilityError


@pytest.fixture(scope="module")
def data():
    """faiss contrib synthetic data (deterministic), normalised so inner product = cosine."""
    ds = SyntheticDataset(32, 2000, 2000, 100, metric="IP", seed=1338)
    xb = l2_normalise(ds.get_database())
    xq = l2_normalise(ds.get_queries())
    # exact ties: duplicate some database vectors under other ids
    xb = np.concatenate([xb, xb[:50]])
    return xb, xq, l2_normalise(ds.get_train())


def brute_force(xb, xq, k, metric="ip"):
    """Reference top-k with numpy: float64 scores, stable order."""
    xb64, xq64 = xb.astype(np.float64), xq.astype(np.float64)
    if metric == "ip":
        scores = xq64 @ xb64.T
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    else:
        scores = (xq64**2).sum(1)[:, None] - 2 * xq64 @ xb64.T + (xb64**2).sum(1)[None, :]
        order = np.argsort(scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order, scores


def assert_same_topk(scores, ids, xb, xq, k, metric="ip", offset=0, atol=1e-5):
    """Tie-tolerant equality: same score lists; ids may permute only among equal scores."""
    ref_scores, ref_ids, all_scores = brute_force(xb, xq, k, metric)
    np.testing.assert_allclose(scores, ref_scores, atol=atol)
    for row in range(len(xq)):
        # each returned id really has the score reported for it
        rows = ids[row] - offset
        np.testing.assert_allclose(all_scores[row, rows], scores[row], atol=atol)
        # ids that are clearly inside the top-k (not tied with the k-th) must match exactly
        kth = ref_scores[row, -1]
        sure = np.abs(ref_scores[row] - kth) > atol
        assert set(ref_ids[row][sure]) <= set(rows), row
        assert len(set(rows)) == len(rows)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_exact_index_matches_brute_force(data, metric):
    xb, xq, _ = data
    index = FaissIndex(xb.shape[1], "Flat", metric)
    index.add(xb[:1000])
    index.add(xb[1000:])  # two batches: default ids continue
    scores, ids = index.search(xq, 10)
    assert scores.dtype == np.float32 and ids.dtype == np.int64 and scores.shape == (100, 10)
    assert_same_topk(scores, ids, xb, xq, 10, metric)


def test_exact_index_ties_and_external_ids(data):
    xb, _, _ = data
    index = FaissIndex(xb.shape[1])
    index.add(xb, ids=np.arange(len(xb)) + 10_000)
    # query with a duplicated vector: two database rows score 1.0, both in the top 2
    scores, ids = index.search(xb[:5], 2)
    np.testing.assert_allclose(scores, 1.0, atol=1e-5)
    for q in range(5):
        assert set(ids[q]) == {10_000 + q, 10_000 + 2000 + q}
    assert_same_topk(*index.search(xb[60:90], 7), xb, xb[60:90], 7, offset=10_000)


def test_k_larger_than_corpus_is_clamped(data):
    xb, xq, _ = data
    index = FaissIndex(xb.shape[1])
    index.add(xb[:5])
    scores, ids = index.search(xq[:3], 50)
    assert scores.shape == ids.shape == (3, 5)
    assert sorted(ids[0]) == [0, 1, 2, 3, 4]
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first
    assert index.search(xq[:0], 3)[1].shape == (0, 3)


def test_hnsw_recall_vs_exact(data):
    xb, xq, _ = data
    exact, hnsw = FaissIndex(xb.shape[1], "Flat"), FaissIndex(xb.shape[1], "HNSW32")
    exact.add(xb)
    hnsw.add(xb)
    hnsw.set_params(efSearch=64)
    _, truth = exact.search(xq, 10)
    _, found = hnsw.search(xq, 10)
    recall = np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, found, strict=True)])
    assert recall > 0.9, recall


def test_ivf_trains_and_recalls(data):
    xb, xq, xt = data
    ivf = FaissIndex(xb.shape[1], "IVF16,Flat")
    assert not ivf.is_trained
    with pytest.raises(ValueError, match="cannot train 'IVF16,Flat' on 5 vectors"):
        ivf.train(xt[:5])
    ivf.train(xt)
    ivf.add(xb)
    exact = FaissIndex(xb.shape[1])
    exact.add(xb)
    _, truth = exact.search(xq, 10)
    ivf.set_params(nprobe=16)  # all lists: exact again
    scores, found = ivf.search(xq, 10)
    assert_same_topk(scores, found, xb, xq, 10)
    ivf.set_params(nprobe=1)
    _, approx = ivf.search(xq, 10)
    recall = np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, approx, strict=True)])
    assert 0.2 < recall < 1.0
    auto = FaissIndex(xb.shape[1], "IVF8,Flat")
    auto.add(xb)  # trains on its own vectors
    assert auto.is_trained and auto.ntotal == len(xb)


def test_missing_neighbours_are_marked(data):
    xb, xq, xt = data
    ivf = FaissIndex(xb.shape[1], "IVF16,Flat")
    ivf.train(xt)
    ivf.add(xb[:20])  # few vectors in 16 lists: nprobe=1 finds fewer than k
    scores, ids = ivf.search(xq, 20)
    missing = ids == -1
    assert missing.any()
    assert np.isneginf(scores[missing]).all() and np.isfinite(scores[~missing]).all()


def test_save_load_round_trip(data, tmp_path):
    xb, xq, _ = data
    index = FaissIndex(xb.shape[1], "HNSW16", embedder_identity="hash:v1:dim=32")
    index.add(xb[:300], ids=np.arange(300) * 7)
    before = index.search(xq, 5)
    index.save(tmp_path / "ix")
    sidecar = json.loads((tmp_path / "ix" / "index.json").read_text())
    assert sidecar["ntotal"] == 300 and sidecar["dim"] == 32 and sidecar["factory"] == "HNSW16"
    loaded = FaissIndex.load(tmp_path / "ix", expect_dim=32, expect_embedder="hash:v1:dim=32")
    after = loaded.search(xq, 5)
    np.testing.assert_array_equal(before[1], after[1])
    np.testing.assert_array_equal(before[0], after[0])
    assert loaded.embedder_identity == "hash:v1:dim=32" and loaded.metric == "ip"
    loaded.add(xb[300:310], ids=np.arange(5000, 5010))  # still usable
    assert loaded.ntotal == 310


def test_load_refuses_mismatches_and_corruption(data, tmp_path):
    xb, _, _ = data
    index = FaissIndex(xb.shape[1], embedder_identity="model-a")
    index.add(xb[:100])
    path = index.save(tmp_path / "ix")
    with pytest.raises(
        IndexCompatibilityError, match="built with embedder 'model-a', not 'model-b'"
    ):
        FaissIndex.load(path, expect_embedder="model-b")
    with pytest.raises(IndexCompatibilityError, match="dim 32, but the embedder gives 384"):
        FaissIndex.load(path, expect_dim=384)
    data_bytes = bytearray((path / "index.faiss").read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0xFF
    (path / "index.faiss").write_bytes(bytes(data_bytes))
    with pytest.raises(CorruptIndexError, match="index.faiss: sha256 does not match"):
        FaissIndex.load(path)
    (path / "index.faiss").write_bytes(b"")
    with pytest.raises(CorruptIndexError):
        FaissIndex.load(path)
    (path / "index.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"index.json:1: invalid JSON"):
        FaissIndex.load(path)
    with pytest.raises(FileNotFoundError, match="no saved index"):
        FaissIndex.load(tmp_path / "nowhere")


def test_bad_input_errors(data):
    xb, xq, _ = data
    index = FaissIndex(32)
    with pytest.raises(ValueError, match="index is empty"):
        index.search(xq, 3)
    with pytest.raises(ValueError, match=r"shape \(n, 32\), got \(10, 16\)"):
        index.add(xb[:10, :16])
    with pytest.raises(ValueError, match="NaN"):
        index.add(np.full((2, 32), np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="empty array"):
        index.add(np.zeros((0, 32), dtype=np.float32))
    index.add(xb[:10])
    with pytest.raises(ValueError, match="unique"):
        index.add(xb[10:12], ids=[3, 99])
    with pytest.raises(ValueError, match="k must be >= 1"):
        index.search(xq, 0)
    with pytest.raises(ValueError, match="invalid FAISS factory string 'Flatt'"):
        FaissIndex(32, "Flatt")
    with pytest.raises(UnknownNameError, match="did you mean 'ip'"):
        FaissIndex(32, metric="ipp")
    with pytest.raises(ValueError, match="no search parameter"):
        index.set_params(nprobe=4)
