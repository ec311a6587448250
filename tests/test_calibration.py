"""The stand-alone cost model and the fair split of a batch's device time (pure, with fakes),
and the on-disk cache of measured rates (tiny random model)."""

from __future__ import annotations

import pytest

from ragbench.llm import calibration
from ragbench.llm.calibration import Rates, fit, split_seconds

# CPU-like: a decode step costs about a 30-token prefill, attention is cheap at short lengths
RATES = Rates(a=0.02, b=0.002, c=2e-6, d0=0.06, d1=2e-5, d_row=0.01)


def test_split_adds_up_and_is_proportional():
    shares = split_seconds(10.0, [1.0, 3.0, 6.0])
    assert shares == pytest.approx([1.0, 3.0, 6.0]) and sum(shares) == 10.0
    odd = split_seconds(1.0, [0.1] * 7)  # float rounding: the shares still sum exactly
    assert sum(odd) == 1.0
    assert split_seconds(3.0, [0.0, 0.0]) == [1.5, 1.5]  # nothing known: even
    assert split_seconds(3.0, []) == []


def test_alone_counts_prefill_decode_and_prefix():
    # 100 prompt tokens, 5 completion tokens: one 100-token prefill, then 4 decode steps over
    # 101..104 positions
    prefill = 0.02 + 0.002 * 100 + 2e-6 * 100 * (101 / 2)
    decode = 4 * 0.06 + 2e-5 * (101 + 102 + 103 + 104)
    assert RATES.alone(100, 5) == pytest.approx(prefill + decode)
    assert RATES.alone(100, 1) == pytest.approx(prefill)  # the prefill emits the first token
    # a reused prefix is not recomputed; one that this request computed is its cost
    reused = RATES.alone(1000, 5, prefix_tokens=990, prefix_computed=False)
    computed = RATES.alone(1000, 5, prefix_tokens=990, prefix_computed=True)
    assert computed == pytest.approx(reused + RATES.forward(990))
    assert reused < RATES.alone(1000, 5)


def test_short_request_in_a_long_batch_is_charged_for_its_own_work():
    """The measured problem: even split charged a 57-token question like its 4k batch mates."""
    work = {"short": (57, 32), "rag": (957, 32), "long_a": (4000, 32), "long_b": (4100, 32)}
    alone = {k: RATES.alone(p, g) for k, (p, g) in work.items()}
    batch_wall = 0.8 * sum(alone.values())  # batching saved 20% overall
    shares = dict(zip(work, split_seconds(batch_wall, list(alone.values())), strict=True))
    assert sum(shares.values()) == pytest.approx(batch_wall)
    for k in work:  # every row saves by the same factor
        assert shares[k] / alone[k] == pytest.approx(0.8)
    assert shares["short"] < shares["rag"] < shares["long_a"] < shares["long_b"]
    assert shares["short"] < 0.3 * shares["long_a"]
    even = batch_wall / len(work)
    assert shares["short"] < 0.5 * even  # what the old split charged it


def test_fit_recovers_the_rates_that_made_the_timings():
    prefill = [(n, p, RATES.forward(n, p)) for n, p in calibration.PREFILL_PROBES]
    decode = [
        (k, r, RATES.d0 + RATES.d_row * (r - 1) + RATES.d1 * r * k)
        for k, r in calibration.DECODE_PROBES
    ]
    got = fit(prefill, decode)
    for name in ("a", "b", "c", "d0", "d1", "d_row"):
        assert getattr(got, name) == pytest.approx(getattr(RATES, name), rel=1e-6), name


def test_account_splits_the_calls_device_time_by_stand_alone_cost():
    from ragbench.llm.hf import HFModel

    model = object.__new__(HFModel)
    model._rates = RATES
    fields = {"text": "", "completion_tokens": 8, "prefill_seconds": 0.1, "decode_seconds": 0.4,
              "queue_seconds": 0.0, "prompt_tokens": 0, "cached_prompt_tokens": 0,
              "padding_tokens": 0, "peak_memory_bytes": None, "finish_reason": "length",
              "model": "m"}  # fmt: skip
    prompts = {0: 57, 1: 957, 2: 4000}
    rows = {
        i: {**fields, "prompt_tokens": n, "meta": {"batch_seconds": 1.0}}
        for i, n in prompts.items()
    }
    work = {
        i: {"prompt_tokens": n, "completion_tokens": 8, "prefix_tokens": 0,
            "prefix_computed": True, "shared": False}
        for i, n in prompts.items()
    }  # fmt: skip
    out = model._account(rows, work, [{"index": 0, "padding_tokens": 0}], device=12.0)
    assert sum(c.resource_seconds for c in out) == pytest.approx(12.0)
    factors = [c.resource_seconds / c.meta["alone_seconds_estimate"] for c in out]
    assert factors == pytest.approx([out[0].meta["call"]["batching_factor"]] * 3, rel=1e-3)
    assert out[0].resource_seconds < out[1].resource_seconds < out[2].resource_seconds
    assert "batch_seconds" not in out[0].meta


def test_rates_are_cached_on_disk_by_model_and_device(tmp_path, monkeypatch):
    from ragbench.llm.hf import HFModel
    from tests.test_hf import _save_tiny

    _save_tiny(tmp_path / "tiny", chat=True)
    model = HFModel(str(tmp_path / "tiny"), device="cpu", cache_dir=tmp_path / "cache")
    rates = model.cost_rates()
    files = list((tmp_path / "cache" / "calibration").glob("*.json"))
    assert len(files) == 1 and rates.meta["key"]["device"] == "cpu"
    # a new process (empty memo) reads the file instead of measuring again
    monkeypatch.setattr(calibration, "_MEMO", {})
    monkeypatch.setattr(calibration, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = HFModel(str(tmp_path / "tiny"), device="cpu", cache_dir=tmp_path / "cache")
    assert again.cost_rates() == rates
