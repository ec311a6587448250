import pytest

from ragbench.analysis import planning as tables
from ragbench.cost import planning
from ragbench.cost.prices import parse_price_sheet

API = parse_price_sheet(
    {
        "name": "t",
        "kind": "api",
        "date": "2025-01-01",
        "source": "test",
        "input_per_million": 1.0,
        "cached_input_per_million": 0.25,
        "output_per_million": 4.0,
    }
)
GPU = parse_price_sheet(
    {
        "name": "g",
        "kind": "gpu_hour",
        "date": "2025-01-01",
        "source": "test",
        "gpu_hour": 3.6,
        "gpus": 2,
    }
)


def test_kv_cache_table_matches_hand_computation():
    t = tables.kv_cache_table(["llama-3.1-8b-instruct"], [8192, 131072])
    # 2 (K,V) x 32 layers x 8 kv heads x 128 dims x 8192 tokens x 2 bytes = 1 GiB exactly
    assert t["kv_bytes"].tolist() == [2 * 32 * 8 * 128 * 8192 * 2, 2 * 32 * 8 * 128 * 131072 * 2]
    assert t["kv_gib"].tolist() == [1.0, 16.0]


def test_max_concurrent_sequences():
    # 80 GiB x 0.9 - 8,030,261,248 params x 2 bytes = 61,248,888,832 bytes; 1 GiB per sequence
    assert planning.max_concurrent_sequences("llama-3.1-8b-instruct", 8192, 80) == 57
    assert planning.max_concurrent_sequences("llama-3.1-8b-instruct", 131072, 24) == 0


def test_api_and_self_hosted_dollars():
    # (900 x 1.0 + 100 x 0.25 + 10 x 4.0) / 1e6 per query, x 1000 queries
    assert planning.api_dollars_per_1k(API, 1000, 10, cached_tokens=100) == pytest.approx(0.965)
    # 1000 / 1000 s prefill + 10 / 10 / 4 s decode shared by 4 sequences = 1.25 GPU-s;
    # 3.6 $/h x 2 GPUs / 3600 = 0.002 $/s
    got = planning.self_hosted_dollars_per_1k(GPU, 1000, 10, 1000, 10, concurrency=4)
    assert got == pytest.approx(1000 * 0.002 * 1.25)
    with pytest.raises(ValueError, match="gpu_hour"):
        planning.api_dollars_per_1k(GPU, 1, 1)


def test_prefix_caching_saving_grows_with_questions():
    t = tables.prefix_caching_table(API, 10_000, 20, 10, [1, 2, 10])
    full = (10_020 * 1.0 + 10 * 4.0) / 1e6
    warm = (20 * 1.0 + 10_000 * 0.25 + 10 * 4.0) / 1e6
    assert t["dollars_per_question_no_cache"].tolist() == pytest.approx([full] * 3)
    assert t["dollars_per_question_prefix_cache"].tolist() == pytest.approx(
        [full, (full + warm) / 2, (full + 9 * warm) / 10]
    )
    assert t["saving"].iloc[0] == 0 and t["saving"].is_monotonic_increasing


def test_capacity_table_is_integer_sequences_per_model_and_length():
    table = tables.capacity_table(
        ["smollm2-135m-instruct", "qwen2.5-7b-instruct"], [1024, 8192], 80.0
    )
    assert list(table.columns) == ["smollm2-135m-instruct", "qwen2.5-7b-instruct"]
    assert table.index.name == "context_tokens" and list(table.index) == [1024, 8192]
    assert all(str(t).startswith("int") for t in table.dtypes)
    assert table.loc[8192, "qwen2.5-7b-instruct"] == planning.max_concurrent_sequences(
        "qwen2.5-7b-instruct", 8192, 80.0
    )


# ---------------------------------------------------------------------------- break-even

CACHED = parse_price_sheet(
    {
        "name": "c",
        "kind": "api",
        "date": "2025-01-01",
        "source": "test",
        "input_per_million": 1.0,
        "cached_input_per_million": 0.1,
        "cache_write_per_million": 1.25,
        "output_per_million": 4.0,
        "min_cacheable_prompt_tokens": 1024,
    }
)


def results(lc_prompt=10_020, kept=10_000, rag_prompt=2_020, closed_book=False):
    import pandas as pd

    rows = []
    for ex in ("a", "b"):
        rows.append(
            {
                "example_id": ex,
                "strategy": "long_context",
                "label": "long_context",
                "prompt_tokens": lc_prompt,
                "completion_tokens": 10,
                "kept_tokens": kept,
                "error": None,
            }
        )
        rows.append(
            {
                "example_id": ex,
                "strategy": "rag",
                "label": "rag k=2",
                "prompt_tokens": rag_prompt,
                "completion_tokens": 10,
                "kept_tokens": None,
                "error": None,
            }
        )
        if closed_book:
            rows.append(
                {
                    "example_id": ex,
                    "strategy": "closed_book",
                    "label": "closed_book",
                    "prompt_tokens": 20,
                    "completion_tokens": 10,
                    "kept_tokens": None,
                    "error": None,
                }
            )
    rows.append(
        {
            "example_id": "c",
            "strategy": "rag",
            "label": "rag k=2",
            "prompt_tokens": None,
            "completion_tokens": None,
            "kept_tokens": None,
            "error": "boom",
        }
    )  # dropped
    return pd.DataFrame(rows)


def test_prefix_cache_break_even_matches_hand_computation():
    table, curve = tables.prefix_cache_break_even(
        results(), [CACHED], questions_per_document=[1, 11, 12]
    )
    row = table.iloc[0]
    # first question: 20 plain + 10,000 written at 1.25 + 10 out at 4 = 12,560 $/1e6
    assert row.lc_first_question_dollars == pytest.approx(12_560e-6)
    # later questions: 20 plain + 10,000 read at 0.1 + 40 = 1,060 $/1e6
    assert row.lc_later_question_dollars == pytest.approx(1_060e-6)
    assert row.rag_dollars_per_query == pytest.approx(2_060e-6)  # 2,020 + 40, every question
    assert row.lc_no_cache_dollars_per_query == pytest.approx(10_060e-6)
    # (12,560 - 1,060) / (2,060 - 1,060) = 11.5: at 11 questions LC is dearer, at 12 cheaper
    assert row.break_even_questions_per_document == pytest.approx(11.5)
    assert row.lc_cheaper_from == 12 and row.prefix_tokens == 10_000 and row.sheet == "c"
    lc = curve[curve.series == "long context, prefix cache"].set_index("questions_per_document")
    rag = curve[curve.series == "rag k=2"].set_index("questions_per_document")
    assert lc.dollars_per_query[1] == pytest.approx(12_560e-6)
    assert lc.dollars_per_query[11] > rag.dollars_per_query[11]
    assert lc.dollars_per_query[12] < rag.dollars_per_query[12]
    assert lc.dollars_per_query[12] == pytest.approx((12_560 + 11 * 1_060) / 12 * 1e-6)


def test_break_even_never_and_from_the_first_question():
    # RAG as cheap as a cached question: long context never catches up
    never, _ = tables.prefix_cache_break_even(results(rag_prompt=1_020), [CACHED])
    assert never.break_even_questions_per_document[0] == float("inf")
    assert never.lc_cheaper_from.isna().all()
    # a prefix under the sheet's 1024-token minimum is never cached: every question full price
    short, _ = tables.prefix_cache_break_even(
        results(lc_prompt=1_020, kept=1_000, rag_prompt=2_020), [CACHED]
    )
    row = short.iloc[0]
    assert row.lc_first_question_dollars == row.lc_later_question_dollars == pytest.approx(1_060e-6)
    assert row.break_even_questions_per_document == 1.0 and row.lc_cheaper_from == 1


def test_break_even_prefix_from_closed_book_or_given_and_errors():
    df = results(closed_book=True).drop(columns="kept_tokens")
    paired, _ = tables.prefix_cache_break_even(df, [CACHED])
    assert paired.prefix_tokens[0] == 10_000  # 10,020 long-context - 20 closed-book tokens
    # the rows without context are named by a parameter, like the compared strategies
    renamed = df.replace({"strategy": {"closed_book": "question_only"}})
    with pytest.raises(ValueError, match="no question_only row"):
        tables.prefix_cache_break_even(
            renamed.replace({"strategy": {"question_only": "x"}}),
            [CACHED],
            closed_book="question_only",
        )
    again, _ = tables.prefix_cache_break_even(renamed, [CACHED], closed_book="question_only")
    assert again.prefix_tokens[0] == 10_000
    given, _ = tables.prefix_cache_break_even(results(), [CACHED], prefix_tokens=5_000)
    assert given.lc_later_question_dollars[0] == pytest.approx((5_020 + 500 + 40) / 1e6)
    with pytest.raises(ValueError, match="prefix_tokens="):
        tables.prefix_cache_break_even(results().drop(columns="kept_tokens"), [CACHED])
    with pytest.raises(ValueError, match="'gpu_hour'"):
        tables.prefix_cache_break_even(results(), [GPU])
    with pytest.raises(ValueError, match="need successful 'long_context' and 'rag'"):
        tables.prefix_cache_break_even(results()[lambda d: d.strategy == "rag"], [CACHED])


def test_break_even_by_group_and_the_write_premium_in_prefix_caching_table():
    import pandas as pd

    df = pd.concat(
        [
            results().assign(context_length=1),
            results(lc_prompt=20_020, kept=20_000, rag_prompt=3_020).assign(context_length=2),
        ]
    )
    table, curve = tables.prefix_cache_break_even(df, [CACHED, API], by="context_length")
    assert list(table.context_length) == [1, 2, 1, 2] and set(curve.sheet) == {"c", "t"}
    c = table[table.sheet == "c"].set_index("context_length").break_even_questions_per_document
    # group 2: first 20 + 20,000 x 1.25 + 40 = 25,060; later 20 + 2,000 + 40 = 2,060;
    # RAG 3,020 + 40 = 3,060: (25,060 - 2,060) / (3,060 - 2,060) = 23 (pooled it would not be)
    assert c[1] == pytest.approx(11.5) and c[2] == pytest.approx(23.0)
    # the planning table's first question now pays the write premium: 10,000 x 1.25
    t = tables.prefix_caching_table(CACHED, 10_000, 20, 10, [1])
    assert t["dollars_per_question_prefix_cache"][0] == pytest.approx(12_560e-6)


def test_kv_cache_wide_keeps_the_given_order_of_models_and_lengths():
    kv = tables.kv_cache_table(["smollm2-135m-instruct", "llama-3.1-8b-instruct"], [8192, 1024])
    wide = tables.kv_cache_wide(kv)
    assert list(wide.columns) == ["smollm2-135m-instruct", "llama-3.1-8b-instruct"]
    assert list(wide.index) == [8192, 1024]  # as capacity_table lays it out
    assert wide.loc[8192, "llama-3.1-8b-instruct"] == 1.0


def test_planned_queries_price_long_context_with_its_question():
    planned = tables.planned_queries(10_000, 500, 1500, 10)
    assert planned.to_dict("records") == [
        {"strategy": "long_context", "prompt_tokens": 10_500, "completion_tokens": 10},
        {"strategy": "rag", "prompt_tokens": 1500, "completion_tokens": 10},
    ]
    t = tables.dollars_per_1k_table(planned, API, GPU, 1000, 10, concurrency=4)
    assert t["prompt_tokens"].tolist() == [10_500, 1500]
    assert t["hosted API $/1k"].tolist() == pytest.approx(
        [planning.api_dollars_per_1k(API, p, 10) for p in (10_500, 1500)]
    )
    assert t["self-hosted GPU $/1k"].tolist() == pytest.approx(
        [planning.self_hosted_dollars_per_1k(GPU, p, 10, 1000, 10, 4) for p in (10_500, 1500)]
    )
    # the same long-context query prefix_caching_table prices without a cache
    caching = tables.prefix_caching_table(API, 10_000, 500, 10, [1])
    no_cache = caching["dollars_per_question_no_cache"].iloc[0] * 1000
    assert t["hosted API $/1k"].iloc[0] == pytest.approx(no_cache)
