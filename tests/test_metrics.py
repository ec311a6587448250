"""Answer metrics against hand-computed values; bootstrap aggregation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ragbench import metrics as m


def test_squad_normalisation():
    assert m.normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert m.normalize_answer("an apple, a pear") == "apple pear"
    assert m.normalize_answer("Theory") == "theory"  # 'the' only as a whole word


@pytest.mark.parametrize(
    ("pred", "golds", "em", "f1"),
    [
        # SQuAD v1.1 dev, Super Bowl 50: golds "Denver Broncos" x3
        ("Denver Broncos", ["Denver Broncos", "Denver Broncos"], 1.0, 1.0),
        ("the Denver Broncos.", ["Denver Broncos"], 1.0, 1.0),
        # 2 shared of 3 predicted, 2 gold: P=2/3, R=1 -> F1 = 0.8
        ("Denver Broncos won", ["Denver Broncos"], 0.0, 0.8),
        # max over golds: "Santa Clara, California" vs "Levi's Stadium" / "Santa Clara"
        # vs "Santa Clara": P=2/3 R=1 -> 0.8; vs "Levi's Stadium": 0
        ("Santa Clara, California", ["Levi's Stadium", "Santa Clara"], 0.0, 0.8),
        # P=1/2, R=1/3 -> F1 = 2*(1/6)/(5/6) = 0.4
        ("Carolina Panthers", ["Panthers beat Denver"], 0.0, 0.4),
        ("nothing in common", ["Denver Broncos"], 0.0, 0.0),
    ],
)
def test_squad_em_f1(pred, golds, em, f1):
    assert m.exact_match(pred, golds) == em
    assert m.f1(pred, golds) == pytest.approx(f1)


def test_ruler_string_match():
    pred = "The special magic numbers are 123 and 456."
    assert m.string_match_all(pred, ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert m.string_match_part(pred, ["789", "456"]) == 1.0
    assert m.string_match_part(pred, ["789"]) == 0.0
    assert m.string_match_all("ABC", ["abc"]) == 1.0  # case-insensitive


def test_contains_is_whole_token():
    assert m.contains("It was the Denver Broncos, clearly.", ["denver broncos"]) == 1.0
    assert m.contains("12345", ["234"]) == 0.0
    assert m.contains("anything", [""]) == 0.0


def test_registry_and_declarations():
    for metric in map(m.get_metric, m.METRICS):
        assert metric.higher_is_better is (metric.kind != "noise") and metric.aggregation == "mean"
    with pytest.raises(ValueError, match="did you mean 'string_match_all'"):
        m.get_metric("string_match_al")
    assert m.score("Denver Broncos won", ["Denver Broncos"], ["f1", "exact_match"]) == {
        "f1": pytest.approx(0.8),
        "exact_match": 0.0,
    }
    with pytest.raises(ValueError, match="no gold answers"):
        m.score("x", [], ["f1"])


def test_bootstrap_ci_deterministic_and_sane():
    values = np.array([1.0] * 30 + [0.0] * 70)
    lo, hi = m.bootstrap_ci(values, n_boot=2000, seed=0)
    assert (lo, hi) == m.bootstrap_ci(values, n_boot=2000, seed=0)
    assert lo < 0.3 < hi
    # normal approximation: 0.3 +- 1.96 * sqrt(0.3*0.7/100) = [0.21, 0.39]
    assert lo == pytest.approx(0.21, abs=0.03) and hi == pytest.approx(0.39, abs=0.03)
    assert m.bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert all(math.isnan(x) for x in m.bootstrap_ci([]))


def test_aggregate_groups_and_missing():
    df = pd.DataFrame(
        {
            "strategy": ["rag"] * 4 + ["long_context"] * 3,
            "f1": [1.0, 0.0, 1.0, None, 0.5, 0.5, 0.5],
        }
    )
    out = m.aggregate(df, by=["strategy"], metric="f1", n_boot=200, seed=1)
    row = out.set_index("strategy")
    assert row.loc["rag", "mean"] == pytest.approx(2 / 3)
    assert row.loc["rag", "n"] == 3 and row.loc["rag", "n_missing"] == 1
    assert row.loc["long_context", "ci_low"] == row.loc["long_context", "ci_high"] == 0.5
    assert list(out.columns[:2]) == ["strategy", "metric"]
    with pytest.raises(ValueError, match="unknown column 'f2'"):
        m.aggregate(df, by=["strategy"], metric="f2")


def test_every_metric_has_a_version_for_the_manifest():
    from ragbench.metrics.answer import METRICS, metric_versions

    versions = metric_versions(list(METRICS))
    assert set(versions) == set(METRICS) and all(isinstance(v, int) for v in versions.values())
    # bumped by the official-scoring fixes: SQuAD 2.0 (every string metric scores its no-answer
    # questions) and LongBench's ROUGE-L
    assert metric_versions(["exact_match", "f1", "contains", "longbench"]) == dict.fromkeys(
        ["exact_match", "f1", "contains", "longbench"], 2
    )
    assert versions["judge_correct"] == 1
    with pytest.raises(ValueError, match="did you mean 'exact_match'"):
        metric_versions(["exact_mach"])
