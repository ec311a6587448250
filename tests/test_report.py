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
                rows.append(
                    {
                        "example_id": f"L{length}-D{depth}",
                        "strategy": strategy,
                        "params": json.dumps(params),
                        "error": None,
                        "string_match_all": float(value),
                        "dollars": cost,
                        "prompt_tokens": length,
                        "resource_seconds": cost,
                        "context_length": length,
                        "depth_percent": depth,
                    }
                )
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
    assert ax.get_xlabel() == "$ per 1,000 queries" and ax.get_legend() is not None


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
    assert table["hardware memory"] == "25.0 GiB"  # the unit in the value, not the key
    assert table["dataset"] == "niah (n=6)"
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
    from ragbench.analysis import planning
    from ragbench.cost.planning import api_dollars_per_1k

    models = ["smollm2-135m-instruct", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct"]
    kv = planning.kv_cache_table(models, [1024, 8192, 32768, 131072])
    ax = report.plot_kv_cache(kv, 80.0)
    assert not _legend_covers_data(ax)
    caching = planning.prefix_caching_table(
        "example-hosted-api", 100_000, 30, 32, [1, 2, 5, 10, 50, 100]
    )
    rag = api_dollars_per_1k("example-hosted-api", 1500, 32) / 1000
    ax = report.plot_prefix_caching(caching, rag)
    assert not _legend_covers_data(ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "RAG"


def test_plot_break_even_draws_each_series_of_one_sheet(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from test_runner import niah_config

    from ragbench import report
    from ragbench.analysis import planning
    from ragbench.experiment.runner import run

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


# ------------------------------------------------------------------ every figure is readable


def test_the_overlap_check_catches_overlapping_ticks_and_a_legend_on_data():
    import matplotlib.pyplot as plt

    from ragbench.report.readable import figure_problems

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(range(40), range(40), label="a line through the legend")
    ax.set_xticks(range(40), [f"label {i}" for i in range(40)])
    ax.legend(loc="center")
    problems = figure_problems(fig)
    assert any("x tick labels" in p and "overlap" in p for p in problems), problems
    assert any("legend covers data" in p for p in problems), problems
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([0, 1], [0, 1], label="a")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    assert figure_problems(fig) == []


def test_a_cost_axis_within_half_a_decade_keeps_its_labels_apart():
    # the range of notebook 06's RULER figure on the fake ($0.0037-0.0078 per 1k queries), whose
    # dense fallback ticks collided there (test_notebooks caught it; this smaller figure did not)
    table = pd.DataFrame(
        {
            "label": ["long_context", "rag k=1"],
            "dollars": [7.76e-6, 3.73e-6],
            "string_match_all": [1.0, 1.0],
            "ci_low": [1.0, 1.0],
            "ci_high": [1.0, 1.0],
        }
    )
    ax = report.plot_accuracy_vs_cost(table)
    from ragbench.report.readable import figure_problems

    assert figure_problems(ax.figure) == []
    labelled = [t for t in ax.xaxis.get_majorticklocs() if 3.7e-3 <= t <= 7.8e-3]
    assert 2 <= len(labelled) <= 5, labelled  # a few even ticks, not the dense fallback (8)


def _results(cost_scale: float, tie: bool) -> pd.DataFrame:
    df = _df()
    df["dollars"] *= cost_scale
    if tie:  # RAG scores exactly like long context: one series would hide the other
        rag = df["strategy"] == "rag"
        df.loc[rag, "string_match_all"] = df.loc[
            df["strategy"] == "long_context", "string_match_all"
        ].to_numpy()
    return df


def _figures(cost_scale: float, tie: bool, lengths: list[int]):
    """(name, figure) for every plot function in ragbench.report.figures, on one data shape."""
    from ragbench import analysis
    from ragbench.analysis import planning

    df = _results(cost_scale, tie)
    table = report.summary(df)
    yield "plot_accuracy_vs_cost", report.plot_accuracy_vs_cost(table).figure
    yield "plot_compare", report.plot_compare(analysis.compare(df)).figure
    records = analysis.attribute(df).assign(
        evidence_depth=lambda d: d["example_id"].map(lambda i: float(i.split("-D")[1]))
    )
    yield "plot_failure_attribution", report.plot_failure_attribution(records)
    yield "plot_metric_by", report.plot_metric_by(df, "context_length").figure
    tuning = (
        pd.DataFrame(
            [
                {
                    "retriever": r,
                    "chunk_size": c,
                    "top_k": k,
                    "gold_hit": min(k / 3, 1.0),
                    "string_match_all": 0.5,
                }
                for r in ("dense", "bm25", "hybrid")
                for c in (64, 128, 256)
                for k in (1, 3, 5)
            ]
        )
        .groupby(["retriever", "chunk_size", "top_k"])
        .mean()
    )
    yield "plot_retrieval_tuning", report.plot_retrieval_tuning(tuning)
    models = ["smollm2-135m-instruct", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct"]
    yield (
        "plot_kv_cache",
        report.plot_kv_cache(planning.kv_cache_table(models, lengths), 80.0).figure,
    )
    caching = planning.prefix_caching_table(
        "example-hosted-api", 100_000, 30, 32, [1, 2, 5, 10, 50, 100]
    )
    yield "plot_prefix_caching", report.plot_prefix_caching(caching, 0.002).figure
    planned = pd.DataFrame(
        [
            {"strategy": "long_context", "prompt_tokens": 100_030, "completion_tokens": 32},
            {"strategy": "rag", "prompt_tokens": 1500, "completion_tokens": 32},
        ]
    )
    sheets = ["example-hosted-api", "openai-gpt-4.1", "anthropic-claude-sonnet-4-5"]
    _, curve = planning.prefix_cache_break_even(planned, sheets, prefix_tokens=100_000)
    yield "plot_break_even", report.plot_break_even(curve, sheet=sheets[-1]).figure
    yield "plot_heatmaps", report.plot_heatmaps(df)


SHAPES = {
    "costs within a decade, ties": (1e-4, True, [1024, 8192]),
    "costs over four decades": (1e-2, False, [1024, 8192, 32768, 131072]),
    "tiny costs, many lengths": (1e-7, True, [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_report_figure_has_readable_ticks_and_a_legend_off_the_data(shape):
    import matplotlib.pyplot as plt

    from ragbench.report.readable import figure_problems

    drawn = []
    for name, fig in _figures(*SHAPES[shape]):
        assert figure_problems(fig) == [], name
        drawn.append(name)
        plt.close(fig)
    plots = sorted(n for n in dir(report) if n.startswith("plot_"))
    assert sorted(drawn) == plots, "a plot function in ragbench.report.figures is not checked here"


def test_tied_series_stay_visible_and_the_legend_says_they_coincide():
    ax = report.plot_metric_by(_results(1.0, tie=True), "context_length")
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "rag k=2 (= long_context)" in texts, texts
    lines = ax.get_lines()
    assert len({line.get_marker() for line in lines}) == len(lines)  # told apart by marker
    assert lines[0].get_markersize() > lines[1].get_markersize()  # the later one drawn inside
    # a tick at each tested length, no other, in compact fixed notation; the axis names its unit
    assert list(ax.get_xticks()) == [1000, 4000, 8000]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "4k", "8k"]
    assert ax.get_xlabel() == "context length (tokens)"


def test_provenance_names_a_file_dataset_by_its_file_and_gives_units(tmp_path):
    manifest = {
        "config": {"dataset": {"name": "file", "params": {"path": "/somewhere/niah-1k.jsonl"}}},
        "dataset": {"name": "file", "n": 4, "fingerprint": "b" * 64},
        "model": {"backend": "fake", "throughput": [1000.0, 50.0]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    table = report.provenance(tmp_path)["provenance"]
    assert table["dataset"] == "file: niah-1k.jsonl (n=4)"
    assert table["model simulated throughput"] == "prefill 1000 tok/s, decode 50 tok/s"


def test_formatted_tables_read_dollars_per_1k_integers_and_percentages():
    table = report.summary(
        _df().assign(
            dollars=lambda d: d["dollars"] * 1.537e-4,
            prompt_tokens=lambda d: d["prompt_tokens"] + 0.6667,
        )
    )
    html = report.formatted(table).to_html()
    assert "dollars ($ / 1k queries)" in html
    assert "$0.1537" in html and "e-0" not in html  # fixed notation, never 1.5370e-04
    assert "83.3%" in html  # rag's mean: a rate as a percentage
    assert "4,334" in html and ".6667" not in html  # token counts as integers
    assert ">6<" in html and "6.0000" not in html  # n as an integer
    assert report.formatted(table).data["dollars"].iloc[0] == table["dollars"].iloc[0]


def test_retrieval_metrics_read_as_percentages_like_their_intervals():
    """ndcg@10 and mrr@5 are shares, as their CIs are: 75.0% beside 50.0%, never 0.75."""
    import pandas as pd

    t = pd.DataFrame(
        {
            "label": ["rag"],
            "ndcg@10": [0.75],
            "ndcg@10_ci_low": [0.5],
            "mrr@5": [1 / 3],
            "hit": [1.0],
            "n": [4],
        }
    )
    text = str(report.formatted(t))
    assert "75.0%" in text and "50.0%" in text and "33.3%" in text and "0.75" not in text
    assert "100.0%" in text  # a bare name (the whole ranking) too


def test_summary_averages_measured_kv_bytes_and_plots_them_with_a_unit():
    df = _df()
    df["kv_bytes_measured"] = df["prompt_tokens"] * 1024  # what the transformers backend logs
    table = report.summary(df)
    assert table.set_index("label").loc["long_context", "kv_bytes_measured"] == pytest.approx(
        1024 * (1000 + 4000 + 8000) / 3
    )
    ax = report.plot_accuracy_vs_cost(table, cost="kv_bytes_measured")
    assert "KV-cache MiB per query (measured)" in ax.get_xlabel()
    assert "memory" in ax.get_title()


# ------------------------------------------------------------------ tables that fit the page


def _cells(html: str) -> list[str]:
    import re

    return re.findall(r"<td [^>]*>([^<]*)</td>", html)


def test_a_wide_summary_splits_into_what_a_reader_needs_first_and_its_detail():
    df = _df().assign(flops=1.5e12, latency_seconds=0.5, amortised_dollars=0.2)
    table = report.summary(df)
    styler = report.formatted(table)
    assert styler.data.columns[0] == "label"
    assert set(styler.data.columns) == set(table.columns)  # every number stays in .data
    html = styler.to_html()
    assert html.count("<table") == 2 and "more columns for the same rows" in html
    [detail] = styler.more
    shown = list(detail.data.columns)
    assert shown[0] == "label" and {"n_missing", "ci_method", "flops"} <= set(shown)
    assert "string_match_all" not in shown and "dollars" not in shown  # those read first
    head = html.split("more columns")[0]
    assert "string_<wbr>match_<wbr>all" in head and "n_<wbr>missing" not in head
    assert ">0<" not in html.split("<tbody>")[1][:200]  # a RangeIndex 0, 1, 2 is not shown
    small = report.formatted(report.self_route_diagnostics(_df()))  # narrow: one table
    assert small.more == [] and small.to_html().count("<table") == 1


def test_a_formatted_table_prints_as_plain_text_and_renders_as_html_in_jupyter():
    df = _df().assign(flops=1.5e12, latency_seconds=0.5, amortised_dollars=0.2)
    table = report.summary(df)
    styler = report.formatted(table)
    text = str(styler)  # was: <ragbench.report.tables...FormattedTable object at 0x...>
    assert text == styler.to_string() == repr(styler)
    assert "<" not in text and "object at" not in text  # was: headers as HTML spans
    lines = text.splitlines()
    assert lines[0].startswith("note: fewer than 30 questions")  # the caption, first
    header = next(line for line in lines if "string_match_all" in line)
    assert header.split()[0] == "label" and "dollars ($ / 1k queries)" in header
    assert any(line.split()[:2] == ["rag", "k=2"] and "83.3%" in line for line in lines)
    # the detail table follows, under its own header, as the HTML has it
    assert "\n\nmore columns for the same rows\n" in text and "n_missing" in text
    assert '<span style="display:inline-block' in styler._repr_html_()  # Jupyter: unchanged


def test_break_even_reads_never_and_comes_first():
    table = pd.DataFrame(
        {
            "sheet": ["example-hosted-api", "anthropic-claude-sonnet-4-5"],
            "sheet_date": ["2025-01-15", "2025-11-01"],
            "rag_label": ["rag k=1", "rag k=1"],
            "rag_dollars_per_query": [1.5e-5, 3e-4],
            "lc_first_question_dollars": [7e-5, 1.5e-3],
            "lc_later_question_dollars": [4e-5, 1e-4],
            "lc_no_cache_dollars_per_query": [7e-5, 1e-3],
            "prefix_tokens": [464.0, 464.0],
            "break_even_questions_per_document": [float("inf"), 2.5],
            "lc_cheaper_from": pd.array([None, 3], dtype="Int64"),
        }
    )
    styler = report.formatted(table)
    first = list(styler.data.columns[:4])
    assert first == ["sheet", "rag_label", "break_even_questions_per_document", "lc_cheaper_from"]
    html = styler.to_html()
    cells = _cells(html)
    assert "inf" not in " ".join(cells).split() and "<NA>" not in html
    # the first row as read: the sheet, the variant, the answer ("never"), then RAG's cost in
    # $ per 1k queries (never 1.5e-05); the second breaks even at 2.5 questions per document
    assert cells[:5] == ["example-hosted-api", "rag k=1", "never", "never", "$0.0150"]
    assert cells[5:10] == ["anthropic-claude-sonnet-4-5", "rag k=1", "2.5", "3", "$0.3000"]
    from ragbench.report.readable import readable_text

    text = readable_text(table)  # the terminal reads "never" too
    assert "never" in text and " inf" not in text


def test_effective_length_at_the_longest_tested_length_reads_at_least():
    df = _df()
    eff = report.effective_context_length(df, threshold=0.5).set_index("label")
    assert bool(eff.loc["rag k=2", "censored"]) and not eff.loc["long_context", "censored"]
    assert eff.loc["rag k=2", "longest_tested"] == 8000
    cells = _cells(report.formatted(eff.reset_index(), rates=["threshold"]).to_html())
    assert "≥ 8,000" in cells and "4,000" in cells and "≥ 4,000" not in cells


def test_heatmap_cells_carry_their_values():
    df = _df()
    fig = report.plot_heatmaps(df, ["long_context", "rag k=2"])
    texts = [[t.get_text() for t in ax.texts] for ax in fig.axes[:2]]
    assert texts[0] == ["100%", "100%", "0%", "100%", "0%", "0%"]  # depth 10 row, then 90
    assert texts[1] == ["100%", "100%", "100%", "100%", "100%", "0%"]
    from ragbench.report.figures import _cell_text

    assert _cell_text(0.996) == ">99%" and _cell_text(0.004) == "<1%" and _cell_text(1.0) == "100%"
    many = pd.concat([_df().assign(depth_percent=d) for d in range(0, 100, 10)])
    big = report.plot_heatmaps(many, ["rag k=2"])
    assert len(big.axes[0].texts) == 30
    assert report.readable.figure_problems(big) == []
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(big)


def test_verdict_detail_of_a_verdict_without_comparisons_shows_the_variants():
    """No variant meets the constraints: nothing was compared (``detail`` is None); the detail
    section shows each variant against them instead of failing."""
    df = _df().assign(contains=lambda d: d["string_match_all"])
    v = report.verdict(df, metric="contains", min_accuracy=0.99)
    assert v.choice is None and v.detail is None
    html = report.verdict_detail(v).to_html()
    assert "no variant meets the constraints" in html and "meets_<wbr>constraints" in html
    assert all(label in html for label in v.variants.index)
    decided = report.verdict(df, metric="contains")
    assert report.verdict_detail(decided).data.equals(report.formatted(decided.detail).data)


def test_verdict_detail_reads_means_and_difference_in_the_units_of_their_interval():
    """mean_a, mean_b and diff are shares like ci_low/ci_high beside them: percentages, never
    0.333 next to -27.4%."""
    df = _df().assign(contains=lambda d: d["string_match_all"])
    v = report.verdict(df, metric="contains")
    shown = report.verdict_detail(v).parts[0]
    row, detail = shown.iloc[0], v.detail.iloc[0]
    for column in ("mean_a", "mean_b", "diff", "ci_low"):
        header = next(h for h in shown.columns if str(h).startswith(column))
        assert row[header] == f"{detail[column]:.1%}", (column, row[header])


def test_tick_labels_keep_the_digit_that_tells_close_ticks_apart():
    from ragbench.report.readable import compact_number

    assert [compact_number(v) for v in (0.125, 0.175, 0.0125, 0.02, 2e-05, 0.5)] == [
        "0.125",
        "0.175",
        "0.0125",
        "0.02",
        "0.00002",
        "0.5",
    ]
    assert [compact_number(v) for v in (1.25, 7000, 8192, 2e6)] == ["1.25", "7k", "8k", "2M"]
