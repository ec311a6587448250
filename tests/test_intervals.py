"""Intervals that are right at small n (Wilson for 0/1 scores, checked against scipy), the note on
rows with few questions, and the run's first metric as every report function's default: the
Python API of docs/python-api.md on a QA run that has only ``exact_match`` and ``f1``."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

import ragbench
from ragbench import analysis, report
from ragbench.analysis._common import default_metric
from ragbench.cli import app
from ragbench.metrics.answer import aggregate, bootstrap_ci, is_binary, mean_ci, wilson_ci

matplotlib.use("Agg")

ROOT = Path(__file__).parents[1]
FIX = ROOT / "tests" / "fixtures"

# ---------------------------------------------------------------------------- Wilson


PAIRS = [
    (k, n)
    for n in (1, 2, 3, 4, 5, 7, 10, 29, 30, 100, 1000)
    for k in sorted({0, 1, n // 2, n - 1, n})
]


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_wilson_matches_scipy_on_many_pairs(level):
    for k, n in PAIRS:
        ref = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
        assert wilson_ci(k, n, level) == pytest.approx((ref.low, ref.high), abs=1e-12), (k, n)


def test_wilson_at_the_edges_is_honest():
    lo, hi = wilson_ci(4, 4)
    assert lo < 0.60 and hi == 1.0  # 4 of 4 correct is not "[100%, 100%]"
    lo, hi = wilson_ci(1, 1)
    assert lo < 0.25 and hi == 1.0
    assert wilson_ci(0, 4) == (0.0, pytest.approx(1 - 0.5101091635454027))
    assert all(math.isnan(x) for x in wilson_ci(0, 0))
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_ci(5, 4)
    with pytest.raises(ValueError, match="level must be in"):
        wilson_ci(1, 2, level=95)


def test_mean_ci_chooses_wilson_for_binary_and_bootstrap_otherwise():
    assert is_binary([0, 1, 1.0, float("nan")]) and not is_binary([0, 0.5, 1])
    assert mean_ci([1, 1, 1, 1]) == (*wilson_ci(4, 4), "wilson")
    assert mean_ci([0.2, 0.9, 0.4], seed=3) == (*bootstrap_ci([0.2, 0.9, 0.4], seed=3), "bootstrap")
    with pytest.raises(KeyError, match="did you mean 'wilson'"):
        mean_ci([1, 0], method="wilsn")


def test_aggregate_picks_one_method_per_column_and_records_it():
    df = pd.DataFrame(
        {
            "strategy": ["rag"] * 4 + ["long_context"] * 3,
            "string_match_all": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, None],
            "f1": [1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 1.0],
        }
    )
    binary = aggregate(df, ["strategy"], "string_match_all").set_index("strategy")
    assert (binary["ci_method"] == "wilson").all()
    assert binary.loc["rag", "ci_low"] < 0.60 and binary.loc["rag", "ci_high"] == 1.0
    assert binary.loc["long_context", "n"] == 2 and binary.loc["long_context", "n_missing"] == 1
    cont = aggregate(df, ["strategy"], "f1").set_index("strategy")
    # rag's f1 is all 1.0 but the column is continuous: every group gets the same kind
    assert (cont["ci_method"] == "bootstrap").all()


# ---------------------------------------------------------------------------- small-n notes


def _results(scores: dict[str, list[float]], metrics=("exact_match", "f1")) -> pd.DataFrame:
    """Rows with these scores, each with an answer (an empty one would get its own note)."""
    rows = []
    for label, values in scores.items():
        for i, v in enumerate(values):
            rows.append(
                {
                    "example_id": f"q{i:03d}",
                    "strategy": label.split()[0],
                    "label": label,
                    "params": json.dumps({}),
                    "prediction": "42",
                    "error": None,
                    **{m: float(v) for m in metrics},
                    "dollars": 0.001,
                    "resource_seconds": 1.0,
                }
            )
    return pd.DataFrame(rows)


def test_summary_of_four_correct_has_a_wide_interval_and_a_note():
    df = _results({"rag k=5": [1, 1, 1, 1], "long_context": [1, 0, 1, 1]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a note is not a warning
        table = report.summary(df)
    row = table.set_index("label").loc["rag k=5"]
    assert row["exact_match"] == 1.0 and row["ci_low"] < 0.60 and row["ci_high"] == 1.0
    assert row["ci_method"] == "wilson" and row["n"] == 4
    assert table.attrs["notes"] == [
        "fewer than 30 questions for: every variant (n=4); intervals are wide"
    ]
    styler = report.formatted(table)
    assert "n" in styler.data.columns  # the count stays in the table people read
    html = styler.to_html()
    assert "note: fewer than 30 questions for: every variant (n=4)" in html
    some = report.summary(_results({"rag k=5": [1] * 4, "long_context": [1] * 30}))
    assert some.attrs["notes"] == ["fewer than 30 questions for: rag k=5 (n=4); intervals are wide"]
    mixed = report.summary(_results({"rag k=5": [1] * 4, "long_context": [1] * 3}))
    assert "every variant (n=3 to 4)" in mixed.attrs["notes"][0]


def test_no_note_from_thirty_questions_and_the_caption_also_carries_warnings():
    df = _results({"rag k=5": [1, 0] * 15, "long_context": [1] * 30})
    table = report.summary(df)
    assert table.attrs["notes"] == [] and (table["n"] == 30).all()
    assert "<caption" not in report.formatted(table).to_html()
    table.attrs["warnings"] = ["Self-Route 'x' never routed <really>"]
    html = report.formatted(table).to_html()
    assert "warning: Self-Route &#x27;x&#x27; never routed &lt;really&gt;" in html


def test_router_headroom_oracle_row_uses_the_tables_interval():
    df = _results({"rag k=5": [1, 0, 1, 0], "long_context": [1, 1, 0, 1]})
    table = report.router_headroom(df)
    oracle = table.set_index("label").loc[analysis.ORACLE_LABEL]
    assert oracle["exact_match"] == 1.0 and oracle["ci_method"] == "wilson"
    assert (oracle["ci_low"], oracle["ci_high"]) == pytest.approx(wilson_ci(4, 4))
    assert "every variant (n=4)" in table.attrs["notes"][0]


def test_ragbench_run_prints_the_note_under_the_table(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(ROOT / "configs" / "fake.yaml"),
            "--quiet",
            "--output-dir",
            str(tmp_path),
            "--limit",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "note: fewer than 30 questions for: every variant (n=2)" in result.output
    assert "ci_method" in result.output and "wilson" in result.output


# ---------------------------------------------------------------------------- default metric


def test_default_metric_is_the_first_metric_column_and_none_is_a_clear_error():
    df = _results({"rag k=5": [1, 0]}, metrics=("f1", "exact_match"))
    assert default_metric(df) == "f1"  # column order = the config's metric order
    assert report.summary(df).columns[1] == "f1"
    with pytest.raises(ValueError, match=r"no answer-metric column.*example_id, strategy"):
        report.summary(df.drop(columns=["f1", "exact_match"]))
    with pytest.raises(KeyError, match="did you mean 'exact_match'"):
        report.summary(df, metric="exact_matc")


def test_every_report_function_defaults_to_the_runs_first_metric():
    df = _results({"rag k=5": [1, 0, 1, 1], "long_context": [1, 1, 0, 1]})
    df["context_length"] = 1000
    df["depth_percent"] = [10, 50, 90, 50] * 2
    assert report.compare(df).attrs["metric"] == "exact_match"
    assert analysis.oracle_router(df).attrs["metric"] == "exact_match"
    assert report.self_route_diagnostics(df).empty
    assert report.self_route_warnings(df) == []
    assert report.effective_context_length(df, threshold=0.5)["effective_length"].notna().all()
    assert analysis.paired_scores(df).shape == (4, 2)
    report.plot_metric_by(df, "depth_percent")
    report.plot_heatmaps(df)
    assert report.heatmap_table(df, "rag k=5").shape == (3, 1)
    table = report.router_headroom(df)
    report.plot_accuracy_vs_cost(table)


def test_docs_python_api_runs_on_a_qa_dataset(tmp_path):
    """docs/python-api.md's example as written, on SQuAD with only exact_match and f1."""
    df = ragbench.run(
        {
            "name": "try",
            "dataset": {
                "name": "file",
                "params": {"path": str(FIX / "squad_v1.json"), "format": "squad"},
            },
            "model": {"backend": "fake", "name": "fake", "cache": False},
            "retrieval": {
                "embedder": "hash",
                "chunk_size": 16,
                "chunk_overlap": 2,
                "tokenizer": "whitespace",
            },
            "strategies": ["long_context", {"name": "rag", "params": {"top_k": 3}}],
            "metrics": ["exact_match", "f1"],
            "price_sheet": "example-hosted-api",
            "output_dir": str(tmp_path),
        }
    )
    assert "string_match_all" not in df.columns
    table = report.summary(df)  # accuracy with a 95% CI, cost columns per variant
    assert table.columns[1] == "exact_match" and (table["ci_method"] == "wilson").all()
    report.formatted(table)
    report.plot_accuracy_vs_cost(table)
    assert report.compare(df).attrs["metric"] == "exact_match"
    report.provenance(df.attrs["run_dir"])


def test_attribute_defaults_to_the_runs_first_metric():
    df = _results({"rag k=5": [1, 0], "long_context": [1, 1]})
    assert report.attribute(df).attrs["metric"] == "exact_match"
