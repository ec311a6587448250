import json

import matplotlib
import pandas as pd
import pytest

from ragbench import report

matplotlib.use("Agg")


def _df():
    rows = []
    for strategy, params, cost, scores in [
        ("long_context", {"overflow": "error"}, 1.0, {1000: [1, 1], 4000: [1, 0], 8000: [0, 0]}),
        ("rag", {"top_k": 2, "order": "score"}, 0.1, {1000: [1, 1], 4000: [1, 1], 8000: [1, 0]}),
        ("closed_book", {}, 0.01, {1000: [0, 0], 4000: [0, 0], 8000: [0, 0]}),
    ]:
        for length, values in scores.items():
            for depth, value in zip((10, 90), values, strict=True):
                rows.append({
                    "example_id": f"L{length}-D{depth}", "strategy": strategy,
                    "params": json.dumps(params), "error": None, "string_match_all": float(value),
                    "dollars": cost, "prompt_tokens": length, "total_seconds": cost,
                    "context_length": length, "depth_percent": depth,
                })  # fmt: skip
    return pd.DataFrame(rows)


def test_labels_name_the_distinguishing_params():
    assert (
        report.strategy_label("rag", '{"top_k": 4, "order": "document"}')
        == "rag k=4 order=document"
    )
    assert (
        report.strategy_label("long_context", {"overflow": "truncate_middle"})
        == "long_context truncate_middle"
    )


def test_summary_pareto_and_effective_length():
    df = _df()
    t = report.summary(df).set_index("label")
    assert t.loc["rag k=2", "string_match_all"] == pytest.approx(5 / 6)
    assert t.loc["long_context", "dollars"] == 1.0
    assert list(t.index) == ["long_context", "rag k=2", "closed_book"]
    front = report.pareto_front(t.reset_index(), "dollars", "string_match_all")
    assert front["label"].tolist() == ["closed_book", "rag k=2"]  # long context is dominated
    eff = report.effective_context_length(df, threshold=0.5).set_index("label")["effective_length"]
    assert eff["rag k=2"] == 8000 and eff["long_context"] == 4000
    assert pd.isna(eff["closed_book"])


def test_heatmap_table_and_plots_have_labels():
    df = _df()
    grid = report.heatmap_table(df, "long_context")
    assert grid.loc[90, 4000] == 0.0 and grid.loc[10, 4000] == 1.0
    with pytest.raises(KeyError, match="did you mean 'rag k=2'"):
        report.heatmap_table(df, "rag k=3")
    fig = report.plot_heatmaps(df, ["long_context", "rag k=2"])
    assert [ax.get_xlabel() for ax in fig.axes[:2]] == ["context length (tokens)"] * 2
    ax = report.plot_accuracy_vs_cost(report.summary(df))
    assert ax.get_xlabel() == "$ per query" and ax.get_legend() is not None
