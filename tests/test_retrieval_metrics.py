"""Retrieval metrics: exact values by hand, and agreement with ranx to 1e-9 on random runs."""

from __future__ import annotations

import random

import pytest

from ragbench.retrieval import metrics as M

RANX_NAMES = {"hit": "hit_rate", "recall": "recall", "mrr": "mrr", "ndcg": "ndcg"}
ALL = [f"{b}@{k}" for b in ("hit", "recall", "mrr", "ndcg") for k in (1, 3, 5, 10)]


def test_hand_computed_values():
    run = {"q": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.1}}
    qrels = {"q": {"b": 1, "d": 2, "z": 0}}  # z is judged non-relevant
    out = M.evaluate(run, qrels, ["hit@1", "hit@2", "recall@2", "recall@4", "mrr@10", "ndcg@4"])
    assert out["hit@1"] == 0.0 and out["hit@2"] == 1.0
    assert out["recall@2"] == 0.5 and out["recall@4"] == 1.0
    assert out["mrr@10"] == 0.5
    expected = (1 / M.math.log2(3) + 2 / M.math.log2(5)) / (2 / 1 + 1 / M.math.log2(3))
    assert out["ndcg@4"] == pytest.approx(expected, abs=1e-12)


def test_ties_keep_run_insertion_order():
    # b and a tie; b was inserted first, so it ranks first.
    assert M.rank({"b": 1.0, "a": 1.0, "c": 2.0}) == ["c", "b", "a"]
    qrels = {"q": {"a": 1}}
    assert M.evaluate({"q": {"b": 1.0, "a": 1.0}}, qrels, ["mrr@10"])["mrr@10"] == 0.5
    assert M.evaluate({"q": {"a": 1.0, "b": 1.0}}, qrels, ["mrr@10"])["mrr@10"] == 1.0


def test_missing_queries_and_no_relevant_score_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}}
    run = {"q1": {"a": 1.0}, "extra": {"a": 1.0}}
    per = M.per_query(run, qrels, ["recall@5", "ndcg@5"])
    assert per["recall@5"] == {"q1": 1.0, "q2": 0.0, "q3": 0.0}
    assert M.evaluate(run, qrels, ["recall@5"])["recall@5"] == pytest.approx(1 / 3)


def test_metric_declarations_and_bad_names():
    m = M.parse_metric("NDCG@10")
    assert (m.name, m.k, m.higher_is_better, m.aggregation) == ("ndcg@10", 10, True, "mean")
    assert M.parse_metric("hit_rate@3").base == "hit"
    assert M.parse_metric("mrr").k is None
    with pytest.raises(ValueError, match="did you mean 'recall@k'"):
        M.parse_metric("recal@10")
    with pytest.raises(ValueError, match="k must be >= 1"):
        M.parse_metric("recall@0")
    with pytest.raises(ValueError, match="qrels is empty"):
        M.evaluate({}, {})
    with pytest.raises(ValueError, match="must be a number"):
        M.evaluate({"q": {"a": float("nan")}}, {"q": {"a": 1}})


def _random_case(rng: random.Random, max_docs: int, ties: bool):
    docs = [f"d{i}" for i in range(40)]
    run, qrels = {}, {}
    for qi in range(30):
        qid = f"q{qi}"
        judged = rng.sample(docs, rng.randint(1, 6))
        qrels[qid] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
        if rng.random() < 0.15:
            continue  # an empty run for this query
        retrieved = rng.sample(docs, rng.randint(1, max_docs))
        if ties:  # few distinct values -> many ties
            scores = {d: float(rng.randint(0, 4)) for d in retrieved}
        else:
            scores = {d: rng.random() for d in retrieved}
        # random insertion order: tied documents keep it, in ranx (a stable sort for rankings
        # of up to 15 documents) and here
        run[qid] = scores
    run["unjudged"] = {"d1": 1.0}
    return run, qrels


# ranx's numba hit_rate kernel casts uint64 -> int64 internally; the reference, not our code
@pytest.mark.filterwarnings("ignore:.*unsafe cast from uint64 to int64")
@pytest.mark.parametrize(
    ("seed", "max_docs", "ties"), [(0, 15, True), (1, 15, True), (2, 40, False)]
)
def test_agrees_with_ranx(seed, max_docs, ties):
    ranx = pytest.importorskip("ranx")
    run, qrels = _random_case(random.Random(seed), max_docs, ties)
    ours = M.per_query(run, qrels, ALL)
    ranx_run = ranx.Run({q: dict(d) for q, d in run.items()})
    ranx_qrels = ranx.Qrels({q: {d: r for d, r in j.items()} for q, j in qrels.items()})
    names = {m: f"{RANX_NAMES[m.split('@')[0]]}@{m.split('@')[1]}" for m in ALL}
    theirs = ranx.evaluate(
        ranx_qrels, ranx_run, list(names.values()), return_mean=False, make_comparable=True
    )
    qids = list(ranx_qrels.keys())  # ranx sorts query ids
    for m in ALL:
        mine = [ours[m][q] for q in qids]
        assert list(theirs[names[m]]) == pytest.approx(mine, abs=1e-9), m
    means = M.evaluate(run, qrels, ALL)
    ranx_means = ranx.evaluate(ranx_qrels, ranx_run, list(names.values()), make_comparable=True)
    for m in ALL:
        assert means[m] == pytest.approx(ranx_means[names[m]], abs=1e-9), m
