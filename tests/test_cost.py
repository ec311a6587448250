"""Cost helpers against hand-computed values."""

from __future__ import annotations

import pytest

from ragbench import cost
from ragbench.cost import money, prices
from ragbench.cost.money import Usage
from ragbench.io import InputFileError
from ragbench.models import get_preset
from ragbench.types import Completion

TINY = {"non_embedding_params": 1000, "layers": 2, "heads": 3, "head_dim": 4}


def test_kv_cache_textbook_example():
    # 2 (K and V) x 100 layers x 80 heads x 128 dims x 1e6 tokens x 1 x 2 bytes
    n = cost.kv_cache_bytes(100, 80, 128, 1_000_000, batch=1, bytes_per_value=2)
    assert n == 4_096_000_000_000
    assert round(n / 1024**3 / 1000, 1) == 3.8  # the "3.8 TB" of the textbook (GiB / 1000)
    assert cost.format_bytes(n) == "3.7 TiB"


def test_kv_cache_smollm2_and_batch_scaling():
    p = get_preset("smollm2-135m-instruct")  # 30 layers, 3 kv heads, head dim 64
    assert cost.kv_cache_bytes(p.layers, p.kv_heads, p.head_dim, 1000) == 23_040_000
    assert cost.kv_cache_bytes(30, 3, 64, 1000, batch=4, bytes_per_value=1) == 46_080_000
    with pytest.raises(ValueError, match="seq_len"):
        cost.kv_cache_bytes(1, 1, 1, -1)


def test_forward_flops_full_prefill_one_new_token():
    # positions 1..10 run; dense 2*1000*10; attention 4*2*3*4*(1+...+10) = 96*55
    f = cost.forward_flops(TINY, prompt_tokens=10, cached_tokens=0, completion_tokens=1)
    assert f == {"dense": 20_000, "attention": 5_280, "total": 25_280}


def test_forward_flops_cached_prefix_and_decode():
    # cached 4: positions 5..10 prefill, then 2 decode steps at 11, 12 -> 8 tokens, sum 68
    f = cost.forward_flops(TINY, prompt_tokens=10, cached_tokens=4, completion_tokens=3)
    assert f == {"dense": 16_000, "attention": 96 * 68, "total": 16_000 + 6_528}
    # everything cached and nothing generated: nothing computed
    assert cost.forward_flops(TINY, 10, 10, 0)["total"] == 0
    with pytest.raises(ValueError, match="cached_tokens"):
        cost.forward_flops(TINY, 10, 11, 1)


def test_forward_flops_attention_is_causal_half_of_square():
    p = get_preset("qwen2.5-7b-instruct")
    n = 32_000
    f = cost.forward_flops(p, n, 0, 1)
    assert f["dense"] == 2 * p.non_embedding_params * n
    approx = 2 * p.layers * p.heads * p.head_dim * n**2
    assert f["attention"] == pytest.approx(approx, rel=1e-4)
    # attention overtakes the dense term past N / (L H d) tokens
    crossover = p.non_embedding_params / (p.layers * p.heads * p.head_dim)
    small, big = (
        cost.forward_flops(p, int(crossover / 2), 0, 1),
        cost.forward_flops(p, int(crossover * 3), 0, 1),
    )
    assert small["attention"] < small["dense"] and big["attention"] > big["dense"]


def test_mfu():
    assert cost.mfu(1e12, 2.0, 1e12) == 0.5
    assert cost.mfu(1e12, 0.0, 1e12) is None
    assert cost.mfu(1e12, 1.0, None) is None


API = {
    "name": "t",
    "kind": "api",
    "date": "2025-01-01",
    "source": "test",
    "input_per_million": 0.15,
    "cached_input_per_million": 0.075,
    "output_per_million": 0.6,
}
GPU = {
    "name": "g",
    "kind": "gpu_hour",
    "date": "2025-01-01",
    "source": "test",
    "gpu_hour": 2.5,
    "gpus": 2,
}


def test_dollars_api_and_gpu_hour():
    c = Completion(
        "x",
        prompt_tokens=1000,
        completion_tokens=100,
        cached_prompt_tokens=400,
        prefill_seconds=1.0,
        decode_seconds=0.44,
    )
    # 600 x 0.15 + 400 x 0.075 + 100 x 0.6 = 180 $ per million queries
    api, gpu = prices.parse_price_sheet(API), prices.parse_price_sheet(GPU)
    assert money.dollars(api, Usage.of(c), prices.resource_seconds(c)) == pytest.approx(180e-6)
    # 2.5 $/h x 2 GPUs x 1.44 s / 3600
    assert money.dollars(gpu, Usage.of(c), prices.resource_seconds(c)) == pytest.approx(0.002)


def test_cost_is_charged_from_resource_seconds_never_latency():
    from dataclasses import replace

    c = Completion("x", 10, 1, prefill_seconds=3.0, decode_seconds=1.0)
    # a backend that measures nothing finer: the time it held the device
    assert prices.resource_seconds(c) == 4.0 and prices.resource_seconds(c, gpus=2) == 8.0
    batched = replace(c, resource_seconds=1.25, queue_seconds=30.0, meta={"batch_size": 4})
    assert batched.latency_seconds == 4.0  # its own time; the harness's queue is apart
    assert (
        prices.resource_seconds(batched) == 1.25 and prices.resource_seconds(batched, gpus=2) == 2.5
    )
    sheet = prices.parse_price_sheet(GPU)
    assert cost.Cost.of(batched, sheet=sheet).dollars == pytest.approx(2.5 * 2 * 1.25 / 3600)
    # queueing longer changes the latency, never the dollars
    later = replace(batched, queue_seconds=300.0)
    assert cost.Cost.of(later, sheet=sheet).dollars == cost.Cost.of(batched, sheet=sheet).dollars
    fields = cost.Cost.of(batched, get_preset("smollm2-135m-instruct"))
    assert fields.resource_seconds == 1.25 and fields.latency_seconds == 4.0
    assert fields.queue_seconds == 30.0 and not hasattr(fields, "total_seconds")
    # completion-cache entries stored before resource_seconds existed carry the share in meta
    legacy = replace(c, meta={"batch_size": 4, "gpu_seconds": 1.25})
    assert prices.resource_seconds(legacy) == 1.25
    # MFU from the device-time share, the same in one part and in a combined (self_route) query
    sheet = prices.PriceSheet(**{**vars(sheet), "peak_flops": 1e12})
    one = cost.Cost.of(batched, get_preset("smollm2-135m-instruct"), sheet)
    assert one.mfu == pytest.approx(one.flops / 1.25 / 1e12)
    nothing = cost.Cost(flops=0, flops_attention=0, dollars=0.0)  # a part that did no work
    assert (one + nothing).mfu == pytest.approx(one.mfu)


def test_shipped_price_sheets_load_with_date_and_source():
    names = prices.available_price_sheets()
    assert {"example-hosted-api", "example-h100-hour", "example-cpu-hour"} <= set(names)
    for name in names:
        sheet = prices.price_sheet(name)
        assert sheet.date and sheet.source and sheet.name == name


def test_price_sheet_errors_name_field(tmp_path):
    bad = dict(API, output_per_milion=1.0)
    with pytest.raises(
        InputFileError, match="output_per_milion.*did you mean 'output_per_million'"
    ):
        prices.parse_price_sheet(bad, "x.yaml")
    no_date = {k: v for k, v in API.items() if k != "date"}
    with pytest.raises(InputFileError, match="'date'"):
        prices.parse_price_sheet(no_date, "x.yaml")
    with pytest.raises(ValueError, match="did you mean 'example-hosted-api'"):
        prices.price_sheet("example-hosted-ap")
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: m\nkind: api\ndate: d\nsource: s\ninput_per_million: -1\n"
        "cached_input_per_million: 0\noutput_per_million: 0\n"
    )
    with pytest.raises(InputFileError, match="mine.yaml.*input_per_million"):
        prices.price_sheet(path)


def test_cost_of_a_completion_and_a_sum():
    p = get_preset("smollm2-135m-instruct")
    sheet = prices.parse_price_sheet(dict(GPU, gpus=1, peak_flops=1e12))
    c = Completion(
        "x", prompt_tokens=1000, completion_tokens=1, prefill_seconds=0.5, decode_seconds=0.0
    )
    f = cost.Cost.of(c, p, sheet)
    expected_flops = 2 * p.non_embedding_params * 1000 + 4 * 30 * 9 * 64 * 500_500
    assert f.flops == expected_flops
    # 1000 prompt positions; the single completion token is sampled, never stored
    assert f.kv_cache_bytes == cost.kv_cache_bytes(30, 3, 64, 1000) == 23_040_000
    assert f.kv_bytes_per_value == 2  # dtype unknown: the bf16/fp16 assumption
    assert f.dollars == pytest.approx(2.5 * 0.5 / 3600)
    assert f.mfu == pytest.approx(expected_flops / 0.5 / 1e12)
    bare = cost.Cost.of(c)
    assert bare.flops is None and bare.dollars is None and bare.prompt_tokens == 1000
    both = f + f
    assert both.prompt_tokens == 2000 and both.flops == 2 * expected_flops
    assert both.llm_calls == 2 and both.kv_cache_bytes == f.kv_cache_bytes
    assert both.mfu == pytest.approx(f.mfu)


def test_cost_kv_cache_positions_are_prompt_plus_completion_minus_one():
    p = get_preset("smollm2-135m-instruct")  # 2 x 30 x 3 x 64 x 2 bytes = 23,040 per position
    c = Completion("x y z", prompt_tokens=100, completion_tokens=5, cached_prompt_tokens=40)
    # 100 prompt positions (cached ones included: they sit in the cache) + 4 fed-back tokens
    assert cost.Cost.of(c, p).kv_cache_bytes == 104 * 23_040
    empty = Completion("", prompt_tokens=100, completion_tokens=0)
    assert cost.Cost.of(empty, p).kv_cache_bytes == 100 * 23_040
    assert cost.query_kv_positions(100, 1) == 100 and cost.query_kv_positions(100, 0) == 100


def test_cost_kv_bytes_follow_the_dtype():
    p = get_preset("smollm2-135m-instruct")
    c = Completion("x", prompt_tokens=10, completion_tokens=3)  # 12 positions
    per_position_value = 2 * 30 * 3 * 64 * 12
    f32 = cost.Cost.of(c, p, kv_dtype="float32")
    assert f32.kv_cache_bytes == per_position_value * 4 and f32.kv_bytes_per_value == 4
    bf16 = cost.Cost.of(c, p, kv_dtype="bfloat16")
    assert bf16.kv_cache_bytes == per_position_value * 2
    fp8 = cost.Cost.of(c, p, kv_dtype="float8_e4m3fn")
    assert fp8.kv_cache_bytes == per_position_value and fp8.kv_bytes_per_value == 1
    assert cost.Cost.of(c, p).kv_cache_bytes == per_position_value * 2  # assumed
    # the other columns do not depend on the dtype
    assert f32.flops == bf16.flops
    assert cost.Cost.of(c, kv_dtype="float32").kv_bytes_per_value is None  # no preset


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float32", 4),
        ("torch.float32", 4),
        ("bfloat16", 2),
        ("float16", 2),
        ("FP16", 2),
        ("float8_e5m2", 1),
        ("fp8", 1),
        ("int8", 1),
        ("float64", 8),
        (None, 2),
        ("", 2),
    ],
)
def test_dtype_bytes(dtype, expected):
    assert cost.dtype_bytes(dtype) == expected


def test_dtype_bytes_torch_dtype_and_unknown_name():
    torch = pytest.importorskip("torch")
    assert cost.dtype_bytes(torch.float32) == 4 and cost.dtype_bytes(torch.bfloat16) == 2
    with pytest.raises(ValueError, match="unknown dtype 'flaot32'; did you mean 'float32'"):
        cost.dtype_bytes("flaot32")
    assert cost.dtype_bytes(None, default=4) == 4


def test_cost_adds_and_flattens_in_field_order():
    p = get_preset("smollm2-135m-instruct")
    sheet = prices.parse_price_sheet(dict(GPU, gpus=1, peak_flops=1e12))
    a = cost.Cost.of(Completion("x", 100, 2, prefill_seconds=0.2, peak_memory_bytes=5), p, sheet)
    b = cost.Cost.of(Completion("y", 900, 3, prefill_seconds=0.8, peak_memory_bytes=9), p, sheet)
    both = a.with_retrieval(0.01) + b
    assert both.prompt_tokens == 1000 and both.llm_calls == 2 and both.peak_memory_bytes == 9
    assert both.retrieval_seconds == 0.01  # only the RAG leg retrieved
    assert both.dollars == pytest.approx(a.dollars + b.dollars)
    assert both.mfu == pytest.approx(
        (a.flops + b.flops) / (a.resource_seconds + b.resource_seconds) / 1e12
    )
    assert (a + cost.Cost.of(Completion("z", 1, 1))).flops is None  # unknown stays unknown
    columns = both.to_dict()
    assert list(columns)[:3] == ["prompt_tokens", "cached_prompt_tokens", "completion_tokens"]
    assert cost.Cost.from_dict(columns) == both
    with pytest.raises(ValueError, match="unknown field"):
        cost.Cost.from_dict({"usd": 1.0})


def test_cost_reads_its_own_fields_only():
    old = {"prompt_tokens": 57, "total_seconds": 2.0, "gpu_seconds": 0.75}  # schema 1's names
    with pytest.raises(ValueError, match="gpu_seconds"):
        cost.Cost.from_dict(old)
    with pytest.raises(ValueError, match="gpu_secs"):
        cost.Cost.from_dict({"gpu_secs": 1.0})


def test_cost_adds_padding_queue_and_both_times():
    a = cost.Cost.of(
        Completion(
            "x",
            60,
            2,
            prefill_seconds=0.2,
            queue_seconds=1.0,
            resource_seconds=0.1,
            padding_tokens=3,
        )
    )
    b = cost.Cost.of(Completion("y", 900, 3, prefill_seconds=0.8, resource_seconds=0.7))
    both = a + b
    assert both.padding_tokens == 3 and both.queue_seconds == 1.0
    assert both.latency_seconds == pytest.approx(1.0) and both.resource_seconds == pytest.approx(
        0.8
    )


def test_repriced_prices_own_and_one_time_costs_through_amortise():
    api, gpu = prices.parse_price_sheet(API), prices.parse_price_sheet(GPU)
    own = cost.Cost(
        prompt_tokens=1000,
        cached_prompt_tokens=400,
        completion_tokens=10,
        resource_seconds=36.0,
        dollars=9.0,
        price_sheet="old",
        mfu=0.5,
    )
    tokens = own.repriced(api)
    assert tokens.dollars == pytest.approx((600 * 0.15 + 400 * 0.075 + 10 * 0.6) / 1e6)
    assert tokens.price_sheet == "t" and tokens.amortised_dollars == tokens.dollars
    assert tokens.mfu == 0.5  # the hardware it was measured on, not the price paid
    hourly = own.repriced(gpu)
    assert hourly.dollars == money.dollars(gpu, seconds=36.0)
    # a one-time cost (a preload) shared by 4 queries: priced by its seconds on an hourly sheet
    shared = own.amortise(cost.Cost(resource_seconds=72.0, dollars=1.0), 4).repriced(gpu)
    once = money.dollars(gpu, seconds=72.0)
    assert shared.one_time_dollars == once and shared.amortised_over == 4
    assert shared.amortised_dollars == pytest.approx(hourly.dollars + once / 4)
    # ... and unknown on an api sheet (a record keeps its seconds, not its tokens), never old
    unknown = own.amortise(cost.Cost(resource_seconds=72.0, dollars=1.0), 4).repriced(api)
    assert unknown.one_time_dollars is None and unknown.amortised_dollars is None
    failed = own.repriced(api, known=False)  # its own accounting was never logged
    assert failed.dollars is None and failed.price_sheet == "old"
