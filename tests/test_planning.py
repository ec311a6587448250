import pytest

from ragbench import planning
from ragbench.prices import parse_price_sheet

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
    t = planning.kv_cache_table(["llama-3.1-8b-instruct"], [8192, 131072])
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
    t = planning.prefix_caching_table(API, 10_000, 20, 10, [1, 2, 10])
    full = (10_020 * 1.0 + 10 * 4.0) / 1e6
    warm = (20 * 1.0 + 10_000 * 0.25 + 10 * 4.0) / 1e6
    assert t["dollars_per_question_no_cache"].tolist() == pytest.approx([full] * 3)
    assert t["dollars_per_question_prefix_cache"].tolist() == pytest.approx(
        [full, (full + warm) / 2, (full + 9 * warm) / 10]
    )
    assert t["saving"].iloc[0] == 0 and t["saving"].is_monotonic_increasing


def test_capacity_table_is_integer_sequences_per_model_and_length():
    table = planning.capacity_table(
        ["smollm2-135m-instruct", "qwen2.5-7b-instruct"], [1024, 8192], 80.0
    )
    assert list(table.columns) == ["smollm2-135m-instruct", "qwen2.5-7b-instruct"]
    assert table.index.name == "context_tokens" and list(table.index) == [1024, 8192]
    assert all(str(t).startswith("int") for t in table.dtypes)
    assert table.loc[8192, "qwen2.5-7b-instruct"] == planning.max_concurrent_sequences(
        "qwen2.5-7b-instruct", 8192, 80.0
    )
