"""Retrievers: dense (FAISS + HashEmbedder), BM25, hybrid RRF, rerank; NIAH-like and multi-doc
corpora with gold chunks from evidence spans, scored with the retrieval metrics."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ragbench.retrieval import metrics
from ragbench.retrieval.build import build_retriever
from ragbench.retrieval.chunking import chunk_documents, gold_chunk_ids
from ragbench.retrieval.embedders.base import HashEmbedder
from ragbench.retrieval.retrievers import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    RerankRetriever,
    to_run,
)
from ragbench.types import Chunk, Document

FILLER_WORDS = [
    "startups",
    "founders",
    "investors",
    "users",
    "product",
    "growth",
    "essay",
    "writing",
    "painting",
    "cities",
    "programming",
    "language",
    "hackers",
    "schools",
    "ideas",
    "money",
    "wealth",
    "design",
    "taste",
    "work",
    "time",
]


def filler(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(8, 14))]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


NEEDLES = {
    "lisbon": (
        "The special magic number for Lisbon is 7463343.",
        "What is the magic number for Lisbon?",
    ),
    "oslo": ("The best thing to do in Oslo is to eat a sandwich.", "What should you do in Oslo?"),
    "kyoto": (
        "Kyoto's secret password is turquoise-elephant.",
        "What is the secret password of Kyoto?",
    ),
}


def niah_corpus(seed: int = 0):
    """One long document with three needles at different depths, plus two other documents."""
    rng = random.Random(seed)
    parts, evidence = [], {}
    text = ""
    for name, (needle, _) in NEEDLES.items():
        text += filler(rng, 25) + " "
        evidence[name] = ("essay", len(text), len(text) + len(needle))
        text += needle + " "
    text += filler(rng, 25)
    parts.append(Document("essay", text))
    parts.append(Document("other1", filler(rng, 30)))
    parts.append(Document("other2", filler(rng, 30)))
    return parts, evidence


@pytest.fixture(scope="module")
def corpus():
    docs, evidence = niah_corpus()
    chunks = chunk_documents(
        docs, splitter="sentence", chunk_size=48, chunk_overlap=8, tokenizer="whitespace"
    )
    qrels = {name: {cid: 1 for cid in gold_chunk_ids(chunks, [evidence[name]])} for name in NEEDLES}
    return chunks, qrels


@pytest.fixture(scope="module")
def retrievers(corpus):
    chunks, _ = corpus
    dense = DenseRetriever(chunks, HashEmbedder(dim=512, seed=0))
    bm25 = BM25Retriever(chunks)
    return {"dense": dense, "bm25": bm25, "hybrid": HybridRetriever([dense, bm25], candidates=20)}


@pytest.mark.parametrize("name", ["dense", "bm25", "hybrid"])
def test_batch_queries_find_the_needles(corpus, retrievers, name):
    chunks, qrels = corpus
    assert len(chunks) > 20 and all(len(g) >= 1 for g in qrels.values())
    qids = list(NEEDLES)
    results = retrievers[name].retrieve([NEEDLES[q][1] for q in qids], k=5)
    assert [len(r) for r in results] == [5, 5, 5]
    for hits in results:
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
    run = to_run(qids, results)
    scores = metrics.evaluate(run, qrels, ["recall@3", "mrr@5", "ndcg@5"])
    assert scores["recall@3"] == 1.0, (name, scores)
    assert scores["mrr@5"] >= 0.5
    assert retrievers[name].num_queries >= 3 and retrievers[name].seconds > 0


def test_dense_flat_equals_brute_force_numpy(corpus):
    chunks, _ = corpus
    emb = HashEmbedder(dim=128, seed=3)
    dense = DenseRetriever(chunks, emb)
    queries = [q for _, q in NEEDLES.values()] + ["founders and investors", "painting cities"]
    results = dense.retrieve(queries, k=7)
    expected = emb.embed_queries(queries) @ emb.embed_documents([c.text for c in chunks]).T
    for row, hits in zip(expected, results, strict=True):
        got = np.array([h.score for h in hits])
        np.testing.assert_allclose(got, np.sort(row)[::-1][:7], atol=1e-5)
        for h in hits:  # tie-tolerant: each id's own score matches its brute-force score
            assert row[dense.position[h.chunk.id]] == pytest.approx(h.score, abs=1e-5)


def test_dense_from_a_saved_index_and_mismatch(corpus, tmp_path):
    from ragbench.retrieval.faiss_index import FaissIndex, IndexCompatibilityError

    chunks, _ = corpus
    emb = HashEmbedder(dim=64)
    DenseRetriever(chunks, emb).index.save(tmp_path)
    loaded = DenseRetriever(chunks, emb, index=FaissIndex.load(tmp_path))
    q = ["What is the magic number for Lisbon?"]
    assert [h.chunk.id for h in loaded.retrieve(q, 3)[0]] == [
        h.chunk.id for h in DenseRetriever(chunks, emb).retrieve(q, 3)[0]
    ]
    with pytest.raises(IndexCompatibilityError, match="rebuild"):
        DenseRetriever(chunks, HashEmbedder(dim=64, seed=1), index=FaissIndex.load(tmp_path))
    with pytest.raises(IndexCompatibilityError, match="vectors but"):
        DenseRetriever(chunks[:5], emb, index=FaissIndex.load(tmp_path))


def test_hybrid_is_weighted_reciprocal_rank_fusion(corpus, retrievers):
    chunks, _ = corpus
    dense, bm25 = retrievers["dense"], retrievers["bm25"]
    hybrid = HybridRetriever([dense, bm25], weights=[2.0, 0.5], rrf_k=10, candidates=8)
    query = ["secret password turquoise"]
    fused = {h.chunk.id: h.score for h in hybrid.retrieve(query, k=8)[0]}  # depth 8 each
    expected: dict[str, float] = {}
    for weight, r in ((2.0, dense), (0.5, bm25)):
        for rank, h in enumerate(r.retrieve(query, 8)[0], start=1):
            expected[h.chunk.id] = expected.get(h.chunk.id, 0.0) + weight / (10 + rank)
    ranked = sorted(expected, key=lambda c: (-expected[c], dense.position[c]))[:8]
    assert list(fused) == ranked
    for cid, score in fused.items():
        assert score == pytest.approx(expected[cid], abs=1e-12)


def test_bm25_details(corpus):
    chunks, _ = corpus
    bm25 = BM25Retriever(chunks, method="robertson", k1=1.2, b=0.5)
    hits = bm25.retrieve(["the a of"], k=4)[0]  # only stopwords: every chunk scores 0
    assert [h.score for h in hits] == [0.0] * 4
    assert [h.chunk.id for h in hits] == [c.id for c in chunks[:4]]  # ties by corpus position
    with pytest.raises(ValueError, match="did you mean 'lucene'"):
        BM25Retriever(chunks, method="lucen")
    import importlib.util

    if importlib.util.find_spec("Stemmer") is None:  # PyStemmer is optional
        with pytest.raises(ImportError, match="pip install PyStemmer"):
            BM25Retriever(chunks, stemmer="english")
    else:
        stemmed = BM25Retriever(chunks, stemmer="english")
        assert stemmed.retrieve(["passwords"], k=1)[0][0].score > 0  # matches "password"


def test_bad_input(corpus, retrievers):
    chunks, _ = corpus
    bm25 = retrievers["bm25"]
    with pytest.raises(ValueError, match="empty query at position 1"):
        bm25.retrieve(["ok", "  "], k=3)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        bm25.retrieve(["ok"], k=0)
    with pytest.raises(TypeError, match="not a single string"):
        bm25.retrieve("ok", k=1)
    assert bm25.retrieve([], k=3) == []
    assert len(bm25.retrieve(["magic"], k=10_000)[0]) == len(chunks)  # k clamps to the corpus
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever([])
    with pytest.raises(ValueError, match="empty corpus"):
        DenseRetriever([], HashEmbedder())
    dup = [Chunk("a", "d", "x y", 0, 3), Chunk("a", "d", "x y", 4, 7)]
    with pytest.raises(ValueError, match="duplicate chunk id 'a'"):
        BM25Retriever(dup)
    with pytest.raises(ValueError, match="different chunks"):
        HybridRetriever([bm25, BM25Retriever(chunks[:3])])
    with pytest.raises(ValueError, match="weights must be 2"):
        HybridRetriever([bm25, bm25], weights=[1.0])


def test_to_run_and_build_retriever(corpus):
    chunks, qrels = corpus
    with pytest.raises(ValueError, match="did you mean 'hybrid'"):
        build_retriever("hybird", chunks)
    with pytest.raises(TypeError, match="unexpected option"):
        build_retriever("bm25", chunks, colour="red")
    with pytest.raises(ValueError, match="needs cross_encoder"):
        build_retriever("rerank", chunks, embedder=HashEmbedder())
    hybrid = build_retriever("hybrid", chunks, embedder="hash", weights=[1.0, 1.0], rrf_k=30)
    assert isinstance(hybrid, HybridRetriever) and hybrid.rrf_k == 30
    results = hybrid.retrieve([NEEDLES["oslo"][1]], k=3)
    run = to_run(["oslo"], results)
    assert list(run["oslo"]) == [h.chunk.id for h in results[0]]
    assert metrics.evaluate(run, {"oslo": qrels["oslo"]}, ["hit@3"])["hit@3"] == 1.0
    with pytest.raises(ValueError, match="query ids must be unique"):
        to_run(["a", "a"], [[], []])
    with pytest.raises(ValueError, match="1 query ids for 2"):
        to_run(["a"], [[], []])


class OverlapScorer:
    """A cross-encoder stand-in scoring word overlap; the real CrossEncoder is in the slow test."""

    def predict(self, pairs, batch_size=32):
        return np.array(
            [len(set(q.lower().split()) & set(t.lower().split())) for q, t in pairs], float
        )


def test_rerank_reorders_the_base_pool(corpus, retrievers):
    base = retrievers["bm25"]
    rerank = RerankRetriever(base, OverlapScorer(), candidates=10)
    query = ["What is the secret password of Kyoto?"]
    pool = base.retrieve(query, 10)[0]
    got = rerank.retrieve(query, k=4)[0]
    overlap = OverlapScorer().predict([(query[0], h.chunk.text) for h in pool])
    assert [h.score for h in got] == sorted(overlap, reverse=True)[:4]
    assert {h.chunk.id for h in got} <= {h.chunk.id for h in pool}


@pytest.mark.slow
def test_rerank_with_a_real_cross_encoder(corpus):
    """A CrossEncoder built from the embedded MiniLM folder (its head is freshly initialised, so
    the scores are not meaningful; this checks the real model runs and orders by its scores)."""
    import torch
    from sentence_transformers import CrossEncoder

    from ragbench.assets import minilm_dir

    chunks, _ = corpus
    torch.manual_seed(0)
    model = CrossEncoder(str(minilm_dir()), device="cpu", num_labels=1)
    rerank = RerankRetriever(BM25Retriever(chunks), model, candidates=6, batch_size=4)
    query = "What is the magic number for Lisbon?"
    got = rerank.retrieve([query], k=6)[0]
    direct = model.predict([(query, h.chunk.text) for h in got])
    np.testing.assert_allclose([h.score for h in got], direct, rtol=1e-5, atol=1e-6)
    assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)


def test_cli_index_build_and_retrieve(tmp_path):
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.retrieval import register
    from ragbench.datasets.formats import write_examples
    from ragbench.types import Example

    docs, evidence = niah_corpus(seed=1)
    examples = [
        Example(name, question, ("x",), tuple(docs), {"evidence": [list(evidence[name])]})
        for name, (_, question) in NEEDLES.items()
    ]
    dataset = write_examples(tmp_path / "data.jsonl", examples)
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    out = tmp_path / "index"
    args = ["index", "build", str(dataset), "--out", str(out), "--chunk-size", "48"]
    args += ["--tokenizer", "whitespace", "--embedder", "hash"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "indexed 3 documents" in result.output
    assert {"chunks.jsonl", "index.faiss", "ids.npy", "index.json", "build.json"} <= {
        p.name for p in out.iterdir()
    }
    for retriever in ("dense", "bm25", "hybrid"):
        result = runner.invoke(
            app,
            [
                "retrieve",
                str(out),
                "magic number for Lisbon",
                "-k",
                "2",
                "--retriever",
                retriever,
                "--width",
                "5000",
            ],
        )
        assert result.exit_code == 0, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 2 and "7463343" in lines[0], (retriever, result.output)
    result = runner.invoke(app, ["retrieve", str(out), "q", "--retriever", "bm26"])
    assert result.exit_code == 2 and "did you mean 'bm25'" in result.output
    (out / "index.faiss").write_bytes(b"garbage")
    result = runner.invoke(app, ["retrieve", str(out), "q"])
    assert result.exit_code == 2 and "corrupted" in result.output


@pytest.mark.parametrize("name", ["dense", "bm25", "hybrid"])
def test_recall_on_the_niah_and_multidoc_datasets(name):
    """The project's own generators: each example is its own corpus; gold chunks come from the
    examples' evidence spans, recall@k from the BEIR run of all examples."""
    from ragbench.datasets import build_dataset

    datasets = {
        "niah": build_dataset(
            "niah", context_lengths=[1024], depth_percents=[10, 50, 90], tokenizer="whitespace"
        ),
        "multidoc": build_dataset(
            "multidoc", num_docs=10, num_examples=3, gold_position=[0, 9], tokenizer="whitespace"
        ),
    }
    for examples in datasets.values():
        run, qrels = {}, {}
        for ex in examples:
            chunks = chunk_documents(ex.documents, "sentence", 64, 8, "whitespace")
            qrels[ex.id] = dict.fromkeys(gold_chunk_ids(chunks, ex.evidence), 1)
            assert qrels[ex.id], ex.id
            retriever = build_retriever(name, chunks, embedder=HashEmbedder(dim=512))
            # a batch of two queries: the question and its last four words
            batch = [ex.question, " ".join(ex.question.split()[-4:])]
            results = retriever.retrieve(batch, k=5)
            run.update(to_run([ex.id], results[:1]))
        scores = metrics.evaluate(run, qrels, ["recall@1", "recall@5"])
        assert scores["recall@5"] == 1.0, (name, scores)
        assert scores["recall@1"] >= 0.5, (name, scores)
