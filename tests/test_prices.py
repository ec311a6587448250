"""Price sheets: tiers, cache writes, the minimum cacheable prefix, errors, shipped sheets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from ragbench.cost import money, prices, prices_import
from ragbench.cost.money import Usage
from ragbench.io import InputFileError
from ragbench.types import Completion

TIERED = {
    "name": "t",
    "kind": "api",
    "date": "2025-01-01",
    "source": "test",
    "input_per_million": 3.0,
    "cached_input_per_million": 0.3,
    "cache_write_per_million": 3.75,
    "cache_ttl": "5m",
    "output_per_million": 15.0,
    "min_cacheable_prompt_tokens": 1024,
    "long_context_tiers": [
        {
            "above_prompt_tokens": 200_000,
            "input_per_million": 6.0,
            "cached_input_per_million": 0.6,
            "output_per_million": 22.5,
        }
    ],
}


def sheet(**over):
    return prices.parse_price_sheet({**TIERED, **over}, "t.yaml")


def test_base_prices_with_cache_read_and_write():
    s = sheet()
    # 10,000 prompt = 2,000 plain + 5,000 read + 3,000 written; 100 out
    got = money.dollars(
        s,
        Usage(
            prompt_tokens=10_000,
            cached_prompt_tokens=5_000,
            completion_tokens=100,
            cache_write_tokens=3_000,
        ),
    )
    assert got == pytest.approx((2_000 * 3.0 + 5_000 * 0.3 + 3_000 * 3.75 + 100 * 15.0) / 1e6)


def test_long_context_tier_prices_the_whole_request_above_the_threshold():
    s = sheet()
    at = money.dollars(s, Usage(prompt_tokens=200_000, completion_tokens=1000))
    above = money.dollars(s, Usage(prompt_tokens=200_001, completion_tokens=1000))
    assert at == pytest.approx((200_000 * 3.0 + 1000 * 15.0) / 1e6)  # not above: base
    assert above == pytest.approx((200_001 * 6.0 + 1000 * 22.5) / 1e6)  # a cliff, every token
    # a tier that leaves the write price out keeps the base write price
    assert s.rates(300_000)["cache_write_per_million"] == 3.75
    got = money.dollars(
        s, Usage(prompt_tokens=300_000, cached_prompt_tokens=250_000, cache_write_tokens=10_000)
    )
    assert got == pytest.approx((40_000 * 6.0 + 250_000 * 0.6 + 10_000 * 3.75) / 1e6)


def test_write_price_defaults_to_input_and_tiers_stack_in_order():
    s = prices.parse_price_sheet(
        {
            **{k: v for k, v in TIERED.items() if k not in ("cache_write_per_million",)},
            "long_context_tiers": [
                {"above_prompt_tokens": 100, "input_per_million": 4.0},
                {"above_prompt_tokens": 1000, "output_per_million": 30.0},
            ],
        }
    )
    assert s.rates(50) == {
        "input_per_million": 3.0,
        "cached_input_per_million": 0.3,
        "cache_write_per_million": 3.0,
        "output_per_million": 15.0,
    }
    assert s.rates(500)["input_per_million"] == 4.0 and s.rates(500)["output_per_million"] == 15.0
    assert s.rates(5000)["input_per_million"] == 4.0 and s.rates(5000)["output_per_million"] == 30


def test_prefix_below_the_minimum_is_plain_input():
    s = sheet()
    short = money.dollars(
        s, Usage(prompt_tokens=2000, cached_prompt_tokens=1000, cache_write_tokens=0)
    )
    assert short == pytest.approx(2000 * 3.0 / 1e6)  # 1000 < 1024: never cached there
    written = money.dollars(s, Usage(prompt_tokens=2000, cache_write_tokens=1023))
    assert written == pytest.approx(2000 * 3.0 / 1e6)
    long = money.dollars(s, Usage(prompt_tokens=2000, cached_prompt_tokens=1024))
    assert long == pytest.approx((976 * 3.0 + 1024 * 0.3) / 1e6)


def test_dollars_rejects_impossible_counts():
    s = sheet()
    with pytest.raises(ValueError, match="exceed prompt_tokens"):
        money.dollars(s, Usage(prompt_tokens=10, cached_prompt_tokens=8, cache_write_tokens=3))
    with pytest.raises(ValueError, match="completion_tokens"):
        money.dollars(s, Usage(prompt_tokens=10, completion_tokens=float("nan")))


def test_gpu_hour_sheet_prices_device_seconds_not_tokens():
    gpu = prices.price_sheet("example-h100-hour")  # 2.50 $/h, 1 GPU
    assert money.dollars(gpu, Usage(prompt_tokens=10**6), 36.0) == pytest.approx(0.025)
    with pytest.raises(ValueError, match="no token prices"):
        gpu.rates(10)


def test_a_completions_usage_reads_cache_writes_from_meta():
    c = Completion("x", 5000, 10, cached_prompt_tokens=0, meta={"cache_write_tokens": 4000})
    assert money.dollars(sheet(), Usage.of(c)) == pytest.approx(
        (1000 * 3.0 + 4000 * 3.75 + 10 * 15.0) / 1e6
    )


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"long_context_tiers": {"above_prompt_tokens": 1}}, "'long_context_tiers'.*list"),
        ({"long_context_tiers": [{"input_per_million": 1.0}]}, r"tiers\[0\].above_prompt_tokens"),
        (
            {"long_context_tiers": [{"above_prompt_tokens": 5, "input_per_milion": 1}]},
            "did you mean 'input_per_million'",
        ),
        (
            {
                "long_context_tiers": [
                    {"above_prompt_tokens": 5, "input_per_million": 1},
                    {"above_prompt_tokens": 5, "input_per_million": 2},
                ]
            },
            r"tiers\[1\].above_prompt_tokens.*ascending",
        ),
        ({"long_context_tiers": [{"above_prompt_tokens": 5}]}, "at least one"),
        (
            {"long_context_tiers": [{"above_prompt_tokens": 5, "output_per_million": -1}]},
            r"tiers\[0\].output_per_million.*>= 0",
        ),
        ({"min_cacheable_prompt_tokens": 1.5}, "min_cacheable_prompt_tokens.*integer"),
        ({"cache_write_per_million": "lots"}, "cache_write_per_million.*number"),
    ],
)
def test_malformed_sheets_name_file_and_field(over, match):
    with pytest.raises(InputFileError, match=f"t.yaml.*{match}"):
        sheet(**over)


def test_gpu_sheets_reject_token_fields():
    gpu = {"name": "g", "kind": "gpu_hour", "date": "d", "source": "s", "gpu_hour": 1, "gpus": 1}
    with pytest.raises(InputFileError, match="'long_context_tiers'.*unknown key"):
        prices.parse_price_sheet({**gpu, "long_context_tiers": []}, "g.yaml")


def test_example_sheets_still_price_as_before():
    api = prices.price_sheet("example-hosted-api")
    assert api.tiers == () and api.min_cacheable_prompt_tokens == 0
    # 600 plain x 0.15 + 400 cached x 0.075 + 100 x 0.60, per million
    got = money.dollars(
        api, Usage(prompt_tokens=1000, cached_prompt_tokens=400, completion_tokens=100)
    )
    assert got == pytest.approx(180e-6)
    cpu = prices.price_sheet("example-cpu-hour")
    assert cpu.peak_flops == 192.0e9  # YAML 1.1 reads `192.0e9` as text; still a number
    assert money.dollars(cpu, seconds=3600) == pytest.approx(0.08)


def test_real_sheets_carry_provider_model_date_source_and_caching_facts():
    real = [n for n in prices.available_price_sheets() if not n.startswith("example-")]
    providers = {prices.price_sheet(n).provider for n in real}
    assert {"openai", "anthropic", "google"} <= providers
    for name in real:
        s = prices.price_sheet(name)
        assert s.model and s.date[:4] == "2025" and "https://" in s.source, name
        assert s.min_cacheable_prompt_tokens >= 1024, name
        r = s.rates(1000)
        assert r["cached_input_per_million"] < r["input_per_million"], name
    sonnet = prices.price_sheet("anthropic-claude-sonnet-4-5")
    assert sonnet.cache_ttl == "5m"
    assert sonnet.rates(1)["cache_write_per_million"] == 1.25 * sonnet.rates(1)["input_per_million"]
    assert sonnet.rates(200_001)["input_per_million"] == 6.0
    assert sonnet.describe()["date"] == sonnet.date


def test_sheet_from_genai_prices_objects():
    # the shapes of genai-prices' ModelPrice / TieredPrices / Tier, without the package
    tiered = SimpleNamespace  # TieredPrices(base, tiers=[Tier(start, price)])
    mp = SimpleNamespace(
        input_mtok=tiered(base=3, tiers=[SimpleNamespace(start=200_000, price=6)]),
        cache_read_mtok=tiered(base=0.3, tiers=[SimpleNamespace(start=200_000, price=0.6)]),
        cache_write_mtok=3.75,
        output_mtok=tiered(base=15, tiers=[SimpleNamespace(start=200_000, price=22.5)]),
    )
    data = prices_import.sheet_from_genai(
        mp, name="x", provider="anthropic", model="m", date="2025-11-01", source="https://x"
    )
    s = prices.parse_price_sheet(yaml.safe_load(prices.sheet_yaml(data)), "x.yaml")
    assert s.rates(10) == {
        "input_per_million": 3.0,
        "cached_input_per_million": 0.3,
        "cache_write_per_million": 3.75,
        "output_per_million": 15.0,
    }
    assert s.rates(200_001)["output_per_million"] == 22.5 and s.cache_ttl == "5m"
    with pytest.raises(ValueError, match="no token prices"):
        prices_import.sheet_from_genai(
            SimpleNamespace(), name="x", provider="p", model="m", date="d", source="s"
        )


def test_import_genai_sheet_from_the_installed_snapshot():
    pytest.importorskip("genai_prices")
    data = prices_import.import_genai_sheet("gpt-4o-mini", "openai")
    s = prices.parse_price_sheet(data)
    assert s.provider == "openai" and s.rates(1)["input_per_million"] > 0


GPU = {"name": "g", "kind": "gpu_hour", "date": "d", "source": "s", "gpu_hour": 2.5, "gpus": 1}


@pytest.mark.parametrize("gpus", [0, -1, 1.5, True])
def test_a_gpu_sheet_holds_a_positive_whole_number_of_devices(gpus):
    with pytest.raises(InputFileError, match=f"'gpus': must be an integer >= 1, got {gpus}"):
        prices.parse_price_sheet({**GPU, "gpus": gpus}, "g.yaml")
    assert prices.parse_price_sheet(GPU, "g.yaml").prices["gpus"] == 1.0


def test_a_sheet_in_another_currency_is_refused_not_shown_as_dollars():
    with pytest.raises(InputFileError, match="'currency': 'EUR': .*US dollars; valid: USD"):
        sheet(currency="EUR")
    assert sheet(currency="USD").currency == sheet().currency == "USD"


@pytest.mark.parametrize("key", ["name", "cached_input_per_million", "date", "source"])
def test_only_a_missing_date_or_source_says_every_sheet_carries_them(key):
    with pytest.raises(InputFileError, match=f"'{key}': required") as err:
        sheet(**{key: None})
    assert ("every sheet carries" in str(err.value)) == (key in ("date", "source"))


def test_a_sheet_files_error_names_the_line_of_its_field(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({**GPU, "gpus": 0}, sort_keys=False), encoding="utf-8")
    with pytest.raises(InputFileError, match=r"g.yaml:6: field 'gpus'"):
        prices.price_sheet(path)
    head = yaml.safe_dump({k: v for k, v in TIERED.items() if k != "long_context_tiers"})
    tiers = "long_context_tiers:\n- above_prompt_tokens: 5\n  input_per_million: 1\n"
    path.write_text(f"{head}{tiers}- input_per_million: 2\n  above_prompt_tokens: 5\n")
    line = len(head.splitlines()) + 5  # the second tier's above_prompt_tokens
    with pytest.raises(InputFileError, match=rf"g.yaml:{line}: field 'long_context_tiers\[1\]"):
        prices.price_sheet(path)


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf", "1e999"])
@pytest.mark.parametrize("key", ["input_per_million", "output_per_million", "gpu_hour"])
def test_a_sheet_with_a_price_that_is_not_finite_is_refused_at_its_line(tmp_path, key, value):
    # an .inf input price was accepted: every dollar NaN (0 x inf), `reprice` printed "-" and a
    # capped run never stopped (NaN passes no comparison)
    base = (
        GPU if key == "gpu_hour" else {k: v for k, v in TIERED.items() if k != "long_context_tiers"}
    )
    lines = yaml.safe_dump(base, sort_keys=False).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith(f"{key}:"))
    lines[at] = f"{key}: {value}"
    path = tmp_path / "s.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=rf"s.yaml:{at + 1}: field '{key}'.*finite number"):
        prices.price_sheet(path)
