"""Analysis: paired comparison against scipy, failure attribution on a RULER multikey run checked
against the known needles, the oracle router and Self-Route diagnostics."""

from __future__ import annotations

import json
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ragbench import analysis, report
from ragbench.analysis.paired import bootstrap_difference

matplotlib.use("Agg")


def _paired_df(scores: dict[str, list[float]], costs: dict[str, float] | None = None):
    """A results table: one row per (question, variant) with the given scores."""
    rows = []
    for label, values in scores.items():
        strategy = label.split()[0]
        for i, v in enumerate(values):
            rows.append(
                {
                    "example_id": f"q{i:03d}",
                    "strategy": strategy,
                    "label": label,
                    "params": json.dumps({}),
                    "prediction": "",
                    "error": None,
                    "string_match_all": float(v),
                    "f1": float(v),
                    "dollars": (costs or {}).get(label, 1.0),
                    "resource_seconds": 1.0,
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- paired comparison


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compare_binary_pairs_use_mcnemar_and_an_interval_that_agrees_with_it(seed):
    rng = np.random.default_rng(seed)
    n = 60
    base = rng.random(n)
    scores = {  # correlated, as variants answering the same questions are
        "rag": (base < 0.7).astype(float),
        "long_context": (base + rng.normal(0, 0.25, n) < 0.5).astype(float),
        "closed_book": (rng.random(n) < 0.1).astype(float),
    }
    df = _paired_df({k: list(v) for k, v in scores.items()})
    table = analysis.compare(df, n_boot=500, seed=seed)
    assert len(table) == 3 and (table["test"] == "tango").all()
    assert table.attrs["comparisons"] == 3
    for row in table.itertuples(index=False):
        a, b = scores[row.a], scores[row.b]
        a_only, b_only = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
        assert (row.a_only, row.b_only) == (a_only, b_only)
        # the raw p is McNemar's (uncorrected) chi-square test, scipy as the reference
        chi2 = (a_only - b_only) ** 2 / (a_only + b_only) if a_only + b_only else 0.0
        assert row.p_value == pytest.approx(stats.chi2.sf(chi2, 1), rel=1e-9)
        assert row.p_adjusted == pytest.approx(min(1.0, 3 * row.p_value))
        assert row.diff == pytest.approx((a - b).mean())
        assert row.ci_low <= row.diff <= row.ci_high
        # one procedure: the interval excludes 0 exactly when the adjusted p is under 0.05
        excludes = row.ci_low > 0 or row.ci_high < 0
        assert row.significant == excludes == (row.p_adjusted < 0.05)
    mixed = table.set_index(["a", "b"]).loc[("rag", "closed_book")]
    assert mixed["significant"] and mixed["winner"] == "rag"


def test_compare_never_shows_an_interval_excluding_zero_beside_a_large_p():
    """The old table paired a percentile bootstrap CI with an exact McNemar p: 5 discordant pairs
    all one way gave an interval above 0 beside p = 0.0625. One procedure cannot."""
    df = _paired_df({"rag": [1.0] * 5 + [1.0] * 10, "long_context": [0.0] * 5 + [1.0] * 10})
    row = analysis.compare(df, n_boot=2000).iloc[0]
    excludes = row["ci_low"] > 0 or row["ci_high"] < 0
    assert excludes == (row["p_adjusted"] < 0.05) == row["significant"]


def test_continuous_metric_uses_the_paired_bootstrap_and_bonferroni():
    rng = np.random.default_rng(3)
    a = rng.random(40)
    df = _paired_df(
        {
            "rag": list(a),
            "long_context": list(np.clip(a - 0.2, 0, 1)),
            "closed_book": list(np.clip(a - 0.21, 0, 1)),
        }
    )
    raw = analysis.compare(df, metric="f1", adjust="none", n_boot=400)
    adjusted = analysis.compare(df, metric="f1", n_boot=400)
    assert (raw["test"] == "paired_bootstrap").all()
    assert raw["p_adjusted"].tolist() == raw["p_value"].tolist()
    assert adjusted["p_adjusted"].to_numpy() == pytest.approx(
        np.minimum(1, 3 * adjusted["p_value"].to_numpy())
    )
    # the same resamples, read at 1 - 0.05 / 3 (Bonferroni over the three pairs)
    lo, hi, _ = bootstrap_difference(
        np.asarray(a) - np.clip(a - 0.2, 0, 1), 400, [0, 0, 1], 0.05 / 3
    )
    row = adjusted.set_index(["a", "b"]).loc[("rag", "long_context")]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((lo, hi))
    assert row["significant"] and row["winner"] == "rag" and row["ci_low"] > 0
    row = adjusted.set_index(["a", "b"]).loc[("long_context", "closed_book")]
    assert row["winner"] == "long_context"  # 0.01 on every question: tiny but consistent
    with pytest.raises(ValueError, match="valid: bonferroni, none"):
        analysis.compare(df, metric="f1", adjust="holm")


def test_decide_names_a_winner_only_when_significant():
    n = 40
    df = _paired_df(
        {
            "rag": [1.0] * 30 + [0.0] * 10,
            "long_context": [1.0] * 29 + [0.0] * 11,  # one question apart from rag
            "closed_book": [0.0] * n,
        }
    )
    table = report.compare(df)
    text = report.decide(table)
    lines = text.splitlines()
    assert lines[0].startswith("rag vs long_context: no significant difference at 0.05")
    assert lines[1].startswith("rag beats closed_book: string_match_all rag - closed_book = +0.750")
    assert lines[2].startswith("long_context beats closed_book")
    assert "=> no variant is significantly better than all others" in lines[-1]
    alone = report.decide(report.compare(df, labels=["rag", "closed_book"]))
    assert alone.splitlines()[-1].startswith("=> rag is significantly better than every other")


def test_compare_rejects_unknown_names_and_duplicates():
    df = _paired_df({"rag": [1, 0], "long_context": [1, 1]})
    with pytest.raises(KeyError, match="did you mean 'string_match_all'"):
        analysis.compare(df, metric="string_match_al")
    with pytest.raises(KeyError, match="did you mean 'long_context'"):
        analysis.compare(df, labels=["long_contxt", "rag"])
    with pytest.raises(
        ValueError, match=r"1 duplicated \(example_id, label\) row \(e.g. \('q000', 'rag'\)\)"
    ):
        analysis.compare(pd.concat([df, df.iloc[:1]]))


def test_compare_pairs_only_questions_both_answered():
    df = _paired_df({"rag": [1, 1, 0, 1], "long_context": [0, 1, 1, 1]})
    df.loc[(df.label == "rag") & (df.example_id == "q000"), ["error", "string_match_all"]] = [
        "TimeoutError",
        np.nan,
    ]
    df = df[~((df.label == "long_context") & (df.example_id == "q003"))]
    row = analysis.compare(df).iloc[0]
    assert row["n"] == 2 and row["a_only"] == 0 and row["b_only"] == 1  # q001, q002


def test_plot_compare_marks_zero_and_pairs():
    df = _paired_df({"rag": [1.0] * 20, "long_context": [0.0] * 20, "closed_book": [0.0] * 20})
    ax = report.plot_compare(report.compare(df, n_boot=200))
    at = {y: t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels(), strict=True)}
    names = [at[y] for y in sorted(at, reverse=True)]  # top to bottom: config order
    assert names == [
        "rag\nminus long_context",
        "rag\nminus closed_book",
        "long_context\nminus closed_book",
    ]
    assert "difference in needle found (string match)" in ax.get_xlabel()


# ---------------------------------------------------------------------------- attribution


MULTIKEY = {
    "context_lengths": [1500],
    "num_examples": 12,
    "tokenizer": "whitespace",
    "haystack": "needles",
    "final_context_length_buffer": 50,
}


def _multikey_run(tmp_path, top_k: int, strategies=()):
    """A RULER multikey run with a scripted reader. Needles haystack: every filler is a keyed
    needle too, so top-1 retrieval sometimes returns another key's needle. The reader, given the
    prompt, follows a script fixed per question (by index): 0 -> name a distractor's value that is
    in its context, 1 -> a wrong value that is no needle's, 2 -> the value of the asked key when
    present (else, like a confused model, the first value it sees). ``seen`` records, per request
    id, whether the gold needle sentence was in the prompt: the truth attribution is checked
    against. One RAG variant per run, so request ids (example:rag) are unique."""
    from ragbench.datasets import build_dataset
    from ragbench.experiment.runner import run
    from ragbench.llm.fake import FakeLLM, split_question

    examples = {e.id: e for e in build_dataset("ruler/niah_multikey", **MULTIKEY)}
    seen: dict[str, dict] = {}

    def reader(request):
        ex_id = request.id.split(":")[0]
        ex = examples[ex_id]
        gold = ex.answers[0]
        context, _ = split_question(request.prompt)
        values = [m["value"] for m in analysis.attribution._NEEDLE.finditer(context)]
        distractors = [v for v in values if v != gold]
        has_gold = f"for {ex.meta['keys'][0]} is: {gold}" in context
        script = int(ex_id[-1], 16) % 3
        if has_gold and script == 0 and distractors:
            answer = distractors[0]
        elif has_gold and script == 1:
            answer = "0000000"
        elif has_gold:
            answer = gold
        else:
            answer = values[0] if values else "unanswerable"
        seen[request.id] = {
            "has_gold": has_gold,
            "answer": answer,
            "distractor": answer in distractors,
        }
        return answer

    cfg = {
        "name": f"t-multikey-k{top_k}",
        "dataset": {"name": "ruler/niah_multikey", "params": MULTIKEY},
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 12,
            "chunk_overlap": 0,
            "tokenizer": "whitespace",
        },
        "strategies": [*strategies, {"name": "rag", "params": {"top_k": top_k}}],
        "metrics": ["string_match_all"],
        "output_dir": str(tmp_path / "results"),
    }
    df = run(cfg, progress=False, llm=FakeLLM(answer_fn=reader))
    return df, examples, seen


def test_attribution_classifies_every_rag_miss_against_the_known_needles(tmp_path):
    # top-1 retrieval misses a needle now and then; top-2 brings a distractor needle along
    df1, examples, seen1 = _multikey_run(tmp_path, 1, ["long_context"])
    df2, _, seen2 = _multikey_run(tmp_path, 2)
    df = pd.concat([df1, df2], ignore_index=True)
    records = analysis.attribute(df, examples=examples)
    assert len(records) == len(df) and (records["outcome"] != "error").all()
    rag = records[records["strategy"] == "rag"]
    misses = rag[~rag["correct"]]
    seen = {"rag k=1": seen1, "rag k=2": seen2}
    for row in misses.itertuples(index=False):
        truth = seen[row.label.split(" embedder")[0]][f"{row.example_id}:rag"]
        if not truth["has_gold"]:
            expected = "retrieval_miss"
        elif truth["distractor"]:
            expected = "distractor_answer"
        else:
            expected = "reader_miss"
        assert row.outcome == expected, (row, truth)
        assert row.distractor_named == truth["distractor"]
    # every cause occurs, so the check above exercised each branch
    assert set(misses["outcome"]) == {"retrieval_miss", "distractor_answer", "reader_miss"}
    for row in rag[rag["correct"]].itertuples(index=False):
        truth = seen[row.label.split(" embedder")[0]][f"{row.example_id}:rag"]
        assert truth["answer"] == examples[row.example_id].answers[0]
    # long context: the whole context is in the prompt, so no retrieval miss; depth for every miss
    lc = records[records["strategy"] == "long_context"]
    assert set(lc.loc[~lc["correct"], "outcome"]) <= {"distractor_answer", "reader_miss"}
    assert lc["evidence_depth"].between(0, 100).all()
    for ex_id, row in lc.set_index("example_id").iterrows():
        start = examples[ex_id].meta["evidence"][0][1]
        assert row["evidence_depth"] == pytest.approx(100 * start / len(examples[ex_id].context))

    table = analysis.attribution_table(records).set_index("label")
    for label, group in misses.groupby("label"):
        counts = group["outcome"].value_counts()
        for cause in ("retrieval_miss", "distractor_answer", "reader_miss"):
            assert table.loc[label, cause] == counts[cause]
        assert table.loc[label, "misses"] == len(group)
        assert table.loc[label, "correct"] + len(group) == table.loc[label, "n"] == 12

    fig = report.plot_failure_attribution(records)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["retrieval miss", "distractor answer", "reader miss"]
    assert fig.axes[1].get_xlabel() == "evidence depth in the context (%)"


def test_attribution_without_examples_and_for_truncation():
    df = pd.DataFrame(
        [
            {
                "example_id": "a",
                "strategy": "rag",
                "label": "rag k=1",
                "prediction": "9",
                "error": None,
                "string_match_all": 0.0,
                "gold_hit": True,
                "depth_percent": 50,
            },
            {
                "example_id": "b",
                "strategy": "rag",
                "label": "rag k=1",
                "prediction": "9",
                "error": None,
                "string_match_all": 0.0,
                "gold_hit": None,
                "depth_percent": 10,
            },
            {
                "example_id": "a",
                "strategy": "long_context",
                "label": "long_context truncate_middle",
                "prediction": "x",
                "error": None,
                "string_match_all": 0.0,
                "truncated_tokens": 30,
                "depth_percent": 50,
            },
            {
                "example_id": "b",
                "strategy": "long_context",
                "label": "long_context truncate_middle",
                "prediction": "",
                "error": "ContextOverflowError: ...",
                "string_match_all": np.nan,
                "truncated_tokens": np.nan,
                "depth_percent": 10,
            },
            {
                "example_id": "a",
                "strategy": "self_route",
                "label": "self_route k=5",
                "prediction": "x",
                "error": None,
                "string_match_all": 0.0,
                "gold_hit": False,
                "route": "long_context",
                "lc_truncated_tokens": 0,
                "lc_evidence_truncated": True,
                "depth_percent": 50,
            },
            {
                "example_id": "a",
                "strategy": "closed_book",
                "label": "closed_book",
                "prediction": "unanswerable",
                "error": None,
                "string_match_all": 0.0,
            },
        ]
    )
    out = analysis.attribute(df).set_index(["example_id", "label"])["outcome"].astype(str)
    assert out.to_dict() == {
        ("a", "rag k=1"): "reader_miss",
        ("b", "rag k=1"): "unattributed",  # no evidence spans: gold_hit unknown
        ("a", "long_context truncate_middle"): "context_truncated",
        ("b", "long_context truncate_middle"): "error",
        ("a", "self_route k=5"): "truncated",  # answered by the long-context branch
        ("a", "closed_book"): "no_context",
    }
    records = analysis.attribute(df)
    with_values = analysis.attribute(df.assign(distractor_values='["9"]'))
    assert with_values["outcome"].astype(str).tolist()[:2] == ["distractor_answer"] * 2
    assert records.set_index(["example_id", "label"]).loc[("a", "closed_book"), "declined"]
    assert records["evidence_depth"].tolist()[:2] == [50, 10]


def test_distractor_values_and_whole_token_match():
    from ragbench.types import Document, Example

    text = (
        "One of the special magic numbers for red-fox is: 1234567. Filler. "
        "One of the special magic numbers for old-mill is: 7654321.\n"
        "One of the special magic numbers for blue-sky is: 1111111."
    )
    ex = Example("e", "q", ("1234567",), (Document("d", text),), {"keys": ["red-fox"]})
    assert analysis.distractor_values(ex) == ("7654321", "1111111")
    assert analysis.names_value("It is 7654321.", ["7654321"])
    assert not analysis.names_value("It is 17654321", ["7654321"])
    stored = Example("e", "q", ("1",), (Document("d", text),), {"distractor_values": ["x"]})
    assert analysis.distractor_values(stored) == ("x",)


# ---------------------------------------------------------------------------- oracle router


def test_oracle_router_picks_the_cheapest_correct_variant():
    df = _paired_df(
        {
            "closed_book": [1, 0, 0, 0],
            "rag k=4": [1, 1, 0, 0],
            "long_context": [1, 1, 1, 0],
            "self_route k=5": [1, 1, 0, 0],
        },
        costs={"closed_book": 0.01, "rag k=4": 0.1, "long_context": 1.0, "self_route k=5": 0.3},
    )
    choices = analysis.oracle_router(df)
    assert choices.attrs["cost"] == "dollars"  # dollars first when every row has them
    assert choices["label"].tolist() == ["closed_book", "rag k=4", "long_context", "closed_book"]
    assert choices["correct"].tolist() == [True, True, True, False]  # q3: nobody, so cheapest
    headroom = report.router_headroom(df)
    assert list(headroom.columns[:6]) == [
        "label",
        "string_match_all",
        "ci_low",
        "ci_high",
        "n",
        "n_missing",
    ]
    table = headroom.set_index("label")
    oracle = table.loc["oracle router"]
    assert oracle["string_match_all"] == 0.75 and oracle["n"] == 4
    assert oracle["dollars"] == pytest.approx((0.01 + 0.1 + 1.0 + 0.01) / 4)
    assert table.loc["long_context", "oracle_gain"] == 0
    assert table.loc["rag k=4", "oracle_gain"] == 0.25
    ax = report.plot_accuracy_vs_cost(headroom)
    _, names = ax.get_legend_handles_labels()
    assert "oracle router" in names and "Pareto front" in names
    front = [line for line in ax.get_lines() if line.get_label() == "Pareto front"][0]
    points = set(zip(front.get_xdata(), front.get_ydata(), strict=True))
    assert (oracle["dollars"], 0.75) not in points  # the oracle marks headroom, not a strategy
    assert len(points) == 3  # closed_book, rag, long_context: each buys accuracy


def test_oracle_cost_falls_back_and_names_bad_choices():
    df = _paired_df({"rag": [1, 0], "long_context": [1, 1]}).drop(columns="dollars")
    df["resource_seconds"] = df["label"].map({"rag": 0.2, "long_context": 2.0})
    assert analysis.oracle_router(df).attrs["cost"] == "resource_seconds"
    table = analysis.router_headroom(df)
    assert table["resource_seconds"].iloc[-1] == pytest.approx(1.1)
    with pytest.raises(KeyError, match="did you mean 'resource_seconds'"):
        analysis.oracle_router(df, cost="resource_second")
    with pytest.raises(KeyError, match="did you mean 'rag'"):
        analysis.oracle_router(df, labels=["rgg"])


# ---------------------------------------------------------------------------- Self-Route


def _self_route_df(routes):
    rows = []
    for i, route in enumerate(routes):
        rows.append(
            {
                "example_id": f"q{i}",
                "strategy": "self_route",
                "label": "self_route k=5",
                "params": "{}",
                "error": None,
                "route": route,
                "string_match_all": float(route == "long_context" or i % 2 == 0),
                "dollars": 0.1,
                "prompt_tokens": 10,
                "resource_seconds": 1.0,
            }
        )
        rows.append(
            {
                "example_id": f"q{i}",
                "strategy": "rag",
                "label": "rag k=5",
                "params": "{}",
                "error": None,
                "string_match_all": float(i % 2 == 0),
                "dollars": 0.1,
                "prompt_tokens": 10,
                "resource_seconds": 1.0,
            }
        )
    return pd.DataFrame(rows)


def test_self_route_diagnostics_rates_and_branch_accuracy():
    df = _self_route_df(["rag", "long_context", "rag", "long_context", "rag", "rag"])
    d = analysis.self_route_diagnostics(df).iloc[0]
    assert (d["n"], d["routed"]) == (6, 2) and d["routing_rate"] == pytest.approx(1 / 3)
    assert d["accuracy_routed"] == 1.0 and d["accuracy_unrouted"] == 0.75
    assert d["accuracy"] == pytest.approx(5 / 6)
    assert analysis.self_route_warnings(df) == []


def test_summary_warns_when_self_route_never_routes():
    df = _self_route_df(["rag"] * 4)
    table = report.summary(df)  # said once, in the table's caption: not a Python warning too
    assert len(table.attrs["warnings"]) == 1 and "none of 4 queries" in table.attrs["warnings"][0]
    assert re.search(r"Self-Route 'self_route k=5' never routed", table.attrs["warnings"][0])
    every = _self_route_df(["long_context"] * 3)
    assert re.search("routed all 3 queries", analysis.self_route_warnings(every)[0])


def test_self_route_routing_counts_every_query_answered():
    """A question without a gold answer (no score) was still routed: the routing counts and the
    warning count it, the accuracy does not."""
    df = _self_route_df(["long_context"] * 4)
    df.loc[df["example_id"] == "q3", "string_match_all"] = np.nan
    d = analysis.self_route_diagnostics(df).iloc[0]
    assert (d["n"], d["routed"], d["n_scored"]) == (4, 4, 3) and d["accuracy"] == 1.0
    assert "routed all 4 queries" in analysis.self_route_warnings(df)[0]


def test_summary_has_no_warnings_without_self_route():
    df = _paired_df({"rag": [1, 0], "long_context": [1, 1]})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.summary(df).attrs["warnings"] == []


# --------------------------------------------------------------------------- truncation evidence


def test_attribution_reads_whether_the_cut_kept_the_evidence():
    base = {"prediction": "x", "error": None, "string_match_all": 0.0, "truncated_tokens": 30}
    lc = {"strategy": "long_context", "label": "long_context truncate_middle"}
    sr = {"strategy": "self_route", "label": "self_route k=5", "route": "long_context"}
    df = pd.DataFrame(
        [
            {"example_id": "gone", **lc, **base, "evidence_truncated": True},
            {"example_id": "kept", **lc, **base, "evidence_truncated": False},
            {"example_id": "none", **lc, **base, "evidence_truncated": None},  # no evidence spans
            {
                "example_id": "text",
                **lc,
                **base,
                "evidence_truncated": "false",
            },  # parquet JSON text
            {
                "example_id": "gone",
                **sr,
                **base,
                "lc_truncated_tokens": 30,
                "lc_evidence_truncated": True,
            },
            {
                "example_id": "kept",
                **sr,
                **base,
                "lc_truncated_tokens": 30,
                "lc_evidence_truncated": False,
            },
        ]
    )
    out = analysis.attribute(df).set_index(["example_id", "strategy"])["outcome"].astype(str)
    assert out.to_dict() == {
        ("gone", "long_context"): "truncated",
        ("kept", "long_context"): "reader_miss",  # the evidence was in the kept text
        ("none", "long_context"): "context_truncated",  # unknown: tokens were cut
        ("text", "long_context"): "reader_miss",
        ("gone", "self_route"): "truncated",
        ("kept", "self_route"): "reader_miss",
    }


def test_attribution_of_a_truncated_run_read_back_from_parquet(tmp_path):
    from test_runner import niah_config

    from ragbench.experiment.resources import load_examples
    from ragbench.experiment.runner import run

    lc = {"name": "long_context", "params": {"overflow": "truncate_tail"}}  # keeps the start
    cfg = niah_config(tmp_path, strategies=["closed_book", lc])
    cfg["model"]["params"] = {"context_window": 1000}
    df = run(cfg, progress=False)
    table = pd.read_parquet(f"{df.attrs['run_dir']}/results.parquet")
    records = analysis.attribute(table, examples=load_examples(cfg))
    outcome = records[records.strategy == "long_context"].set_index("example_id")["outcome"]
    assert outcome.astype(str).to_dict() == {
        "niah-L400-D10": "correct",
        "niah-L400-D90": "correct",
        "niah-L1500-D10": "correct",  # cut, but the needle was in the kept start
        "niah-L1500-D90": "truncated",  # was: context_truncated
    }


def test_a_self_route_that_never_routed_is_compared_not_equated_with_rag():
    df = _self_route_df(["rag"] * 4)  # the same answers as rag k=5: 50% each
    [same] = analysis.self_route_warnings(df)
    assert "every answer came from its RAG step" in same and "equals RAG" not in same
    assert "It scored 50%, as 'rag k=5' did, on string_match_all over the same 4 questions" in same
    # its RAG step reads another prompt (the 'unanswerable' option): the scores can differ
    df.loc[df["strategy"] == "rag", "string_match_all"] = 1.0
    [differ] = analysis.self_route_warnings(df)
    assert "It scored 50% against 100% for 'rag k=5'" in differ and "as 'rag k=5' did" not in differ
    # a RAG variant that retrieved differently is not its twin
    df.loc[df["strategy"] == "rag", "params"] = '{"top_k": 2}'
    df.loc[df["strategy"] == "self_route", "params"] = '{"top_k": 5, "overflow": "error"}'
    [alone] = analysis.self_route_warnings(df)
    assert "rag k=5" not in alone.split("never routed")[1] and "It scored" not in alone


def test_summary_raises_no_python_warning_and_the_caption_says_it_once():
    import warnings

    df = _self_route_df(["rag"] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a UserWarning would print a second copy with file:line
        table = report.summary(df)
    html = report.formatted(table).to_html()
    assert html.count("never routed") == 1 and "/ragbench/" not in html
