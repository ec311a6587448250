"""Money in one place: ``ragbench.cost.money.dollars`` prices every case a sheet supports, and
no other module reads a sheet's rates (an ast scan of the package)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from ragbench.cost.money import COST_BASES, Seconds, Usage, dollars
from ragbench.cost.prices import parse_price_sheet, price_sheet
from ragbench.types import Completion

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ragbench"
# the modules that may read a sheet's rates: the one function, and the sheet's own parser/writer
RATE_READERS = {"cost/money.py", "cost/prices.py", "cost/prices_import.py"}
RATE_KEYS = {
    "input_per_million",
    "cached_input_per_million",
    "cache_write_per_million",
    "output_per_million",
    "gpu_hour",
    "gpus",
}

API = parse_price_sheet(
    {
        "name": "api",
        "kind": "api",
        "date": "2025-01-01",
        "source": "test",
        "input_per_million": 2.0,
        "cached_input_per_million": 0.5,
        "cache_write_per_million": 2.5,
        "output_per_million": 8.0,
        "min_cacheable_prompt_tokens": 1024,
        "long_context_tiers": [
            {"above_prompt_tokens": 100_000, "input_per_million": 4.0, "output_per_million": 12.0}
        ],
    }
)
HOURLY = parse_price_sheet(
    {
        "name": "gpu",
        "kind": "gpu_hour",
        "date": "2025-01-01",
        "source": "test",
        "gpu_hour": 3.6,
        "gpus": 2,
    }
)


def test_tokens_on_a_per_token_sheet():
    # plain input, cached input at its discount, cache writes at their premium, output
    usage = Usage(
        prompt_tokens=10_000,
        cached_prompt_tokens=4_000,
        completion_tokens=100,
        cache_write_tokens=3_000,
    )
    want = (3_000 * 2.0 + 4_000 * 0.5 + 3_000 * 2.5 + 100 * 8.0) / 1e6
    assert dollars(API, usage) == pytest.approx(want)
    # seconds are not what a per-token sheet charges
    assert dollars(API, usage, Seconds(99.0, 1.0), "calibrated") == dollars(API, usage)
    # a prompt over the tier's threshold pays the tier's rates on every token
    long = Usage(prompt_tokens=100_001, completion_tokens=10)
    assert dollars(API, long) == pytest.approx((100_001 * 4.0 + 10 * 12.0) / 1e6)
    # a cache read or write under the provider's minimum prefix is plain input
    short = Usage(prompt_tokens=2_000, cached_prompt_tokens=1_023, cache_write_tokens=900)
    assert dollars(API, short) == dollars(API, Usage(prompt_tokens=2_000))
    assert dollars(API, Usage()) == 0.0


def test_a_completions_usage():
    c = Completion("x", 5_000, 10, cached_prompt_tokens=2_000, meta={"cache_write_tokens": 1_500})
    assert Usage.of(c) == Usage(5_000, 2_000, 10, 1_500)
    assert Usage.of(Completion("x", 5, 1)).cache_write_tokens == 0


def test_device_seconds_on_an_hourly_sheet_by_basis():
    # $3.6 an hour x 2 devices: 0.002 $ per second held
    assert dollars(HOURLY, seconds=36.0) == pytest.approx(0.072)
    both = Seconds(measured=36.0, modelled=18.0)
    assert dollars(HOURLY, seconds=both, basis="calibrated") == pytest.approx(0.036)
    for basis in ("measured", "mixed", None):  # anything but calibrated: the measured seconds
        assert dollars(HOURLY, seconds=both, basis=basis) == pytest.approx(0.072)
    # calibrated without a model of the work: the measured seconds
    assert dollars(HOURLY, seconds=Seconds(36.0), basis="calibrated") == pytest.approx(0.072)
    # tokens are not what an hourly sheet charges
    assert dollars(HOURLY, Usage(prompt_tokens=10**6), 36.0) == dollars(HOURLY, seconds=36.0)
    assert set(COST_BASES) == {"calibrated", "measured"}


def test_many_queries_keep_the_order_the_per_1k_figures_had():
    # $ per 1,000 queries: the hourly rate x 1000 first, as planning always multiplied
    for s in (0.1, 1 / 3, 2.7182818, 12345.678):
        for sheet in map(price_sheet, ("example-cpu-hour", "example-h100-hour")):
            p = sheet.prices
            hourly = p["gpu_hour"] * p["gpus"]
            assert dollars(sheet, seconds=s, queries=1000) == 1000 * hourly * s / 3600
            assert dollars(sheet, seconds=s) == p["gpu_hour"] * p["gpus"] * s / 3600.0
    usage = Usage(prompt_tokens=1_234, cached_prompt_tokens=0, completion_tokens=77)
    assert dollars(API, usage, queries=1000) == 1000 * dollars(API, usage)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: dollars(
                API, Usage(prompt_tokens=10, cached_prompt_tokens=8, cache_write_tokens=3)
            ),
            "exceed prompt_tokens",
        ),
        (lambda: dollars(API, Usage(prompt_tokens=math.nan)), "prompt_tokens must be"),
        (lambda: dollars(HOURLY, seconds=-1.0), "device_seconds must be"),
        (lambda: dollars(HOURLY, seconds=Seconds(1.0, 0.5), basis="calibate"), "cost basis"),
    ],
)
def test_what_has_no_price_is_an_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------- one place


def _rate_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) of every read of a price sheet's rates: ``x.prices``, ``x.rates(...)``, and
    ``x["<rate>"]`` / ``x.get("<rate>")`` of a rate key."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "prices":
            found.append((node.lineno, ".prices"))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "rates":
            found.append((node.lineno, ".rates()"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in RATE_KEYS:
                found.append((node.lineno, f"[{key.value!r}]"))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and first.value in RATE_KEYS:
                found.append((node.lineno, f".get({first.value!r})"))
    return found


def test_only_the_money_module_reads_a_sheets_rates():
    outside = [
        f"{path.relative_to(ROOT)}:{line}: reads {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in RATE_READERS
        for line, what in _rate_reads(path.read_text(encoding="utf-8"))
    ]
    assert outside == [], "price through ragbench.cost.money.dollars(sheet, usage, seconds, basis)"


def test_the_rate_scan_sees_a_planted_read():
    planted = (
        "hourly = sheet.prices['gpu_hour'] * sheet.prices['gpus']\n"
        "r = sheet.rates(1000)\n"
        "x = p['output_per_million'] + p.get('cached_input_per_million', 0)\n"
        "hw['gpus'] = 4\n"  # a write of a dict that happens to use the name: not a rate read
    )
    assert sorted(_rate_reads(planted)) == sorted(
        [
            (1, "['gpu_hour']"),
            (1, "['gpus']"),
            (1, ".prices"),
            (1, ".prices"),
            (2, ".rates()"),
            (3, "['output_per_million']"),
            (3, ".get('cached_input_per_million')"),
        ]
    )
