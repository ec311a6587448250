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
                    "dollars": cost, "prompt_tokens": length, "resource_seconds": cost,
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


def test_cost_axis_labels_more_than_one_tick_within_a_decade():
    df = _df()
    df["dollars"] = df["dollars"].map({1.0: 3.8e-4, 0.1: 7.5e-5, 0.01: 1.7e-5})  # < 1.5 decades
    ax = report.plot_accuracy_vs_cost(report.summary(df))
    ax.figure.canvas.draw()
    low, high = ax.get_xlim()
    shown = [t for t in ax.xaxis.get_majorticklocs() if low <= t <= high]
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(shown) >= 4 and len(labels) >= 4, labels


def test_retrieval_tuning_plot_has_integer_k_ticks():
    rows = [
        {"retriever": r, "chunk_size": c, "top_k": k, "gold_hit": k / 5, "string_match_all": 0.5}
        for r in ("dense", "bm25")
        for c in (64, 128)
        for k in (1, 3, 5)
    ]
    tuning = pd.DataFrame(rows).groupby(["retriever", "chunk_size", "top_k"]).mean()
    fig = report.plot_retrieval_tuning(tuning)
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 5]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert ax.get_xlabel() == "k (chunks retrieved)"
    assert len(fig.axes[1].get_legend().get_texts()) == 4


def test_provenance_has_one_row_per_fact_and_nothing_cut(tmp_path):
    manifest = {
        "config_hash": "a" * 64,
        "dataset": {"name": "niah", "n": 6, "fingerprint": "b" * 64},
        "model": {"backend": "HFModel", "dtype": "float32", "weights": "files-sha256:" + "c" * 64},
        "records": 18,
        "errors": 0,
        "resumed_records": 0,
        "git_commit": "d" * 40,
        "versions": {"torch": "2.13.0", "transformers": "5.24.0", "faiss-cpu": None},
        "hardware": {"cpus": 2, "memory_bytes": 25 * 2**30},
        "started_at": "2026-12-03T06:46:08+00:00",
        "finished_at": "2026-12-03T06:46:20+00:00",
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    table = report.provenance(tmp_path)["provenance"]
    assert table["model weights"] == "files-sha256:" + "c" * 16
    assert table["version transformers"] == "5.24.0" and "version faiss-cpu" not in table
    assert table["hardware memory_bytes"] == "25.0 GiB"
    longest = table.str.len().max()
    assert longest <= pd.get_option("display.max_colwidth"), table  # shown whole, never cut


def _legend_covers_data(ax) -> bool:
    """Whether the legend's box covers a plotted marker or crosses a horizontal reference line."""
    ax.figure.canvas.draw()
    box = ax.get_legend().get_window_extent()
    for line in ax.get_lines():
        x, y = line.get_xdata(), line.get_ydata()
        if len(set(y)) == 1 and line.get_linestyle() == "--":  # axhline across the axes
            _, py = ax.transData.transform((1, y[0]))
            inside = ax.get_window_extent()
            if box.y0 <= py <= box.y1 and box.x0 < inside.x1 and box.x1 > inside.x0:
                return True
            continue
        for px, py in ax.transData.transform(list(zip(x, y, strict=True))):
            if box.contains(px, py):
                return True
    return False


def test_planning_plots_keep_the_legend_off_the_data():
    from ragbench import planning

    models = ["smollm2-135m-instruct", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct"]
    kv = planning.kv_cache_table(models, [1024, 8192, 32768, 131072])
    ax = report.plot_kv_cache(kv, 80.0)
    assert not _legend_covers_data(ax)
    caching = planning.prefix_caching_table(
        "example-hosted-api", 100_000, 30, 32, [1, 2, 5, 10, 50, 100]
    )
    rag = planning.api_dollars_per_1k("example-hosted-api", 1500, 32) / 1000
    ax = report.plot_prefix_caching(caching, rag)
    assert not _legend_covers_data(ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "RAG"


def test_plot_break_even_draws_each_series_of_one_sheet(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from test_runner import niah_config

    from ragbench import planning, report
    from ragbench.runner import run

    cfg = niah_config(
        tmp_path, strategies=["long_context", {"name": "rag", "params": {"top_k": 1}}]
    )
    df = run(cfg, progress=False)
    _, curve = planning.prefix_cache_break_even(df, ["example-hosted-api", "openai-gpt-4.1"])
    ax = report.plot_break_even(curve, sheet="openai-gpt-4.1")
    labels = [line.get_label() for line in ax.get_lines()]
    assert len(labels) == 3 and sum(lab.startswith("long context") for lab in labels) == 2
    assert "openai-gpt-4.1" in ax.get_title() and "1,000 queries" in ax.get_ylabel()
    rag = next(line for line in ax.get_lines() if line.get_label().startswith("rag"))
    assert len(set(rag.get_ydata())) == 1  # RAG pays full price for every question
    with pytest.raises(ValueError, match="did you mean"):
        report.plot_break_even(curve, sheet="openai-gpt-4.2")
