"""The stand-alone cost model and the fair split of a batch's device time (pure, with fakes),
and the on-disk cache of measured rates (tiny random model)."""

from __future__ import annotations

import pytest

from ragbench.llm import calibration
from ragbench.llm.cost_model import Rates, fit, split_seconds
from ragbench.llm.cpu_share import CpuShare

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
    plan = calibration.probe_plan(4096)
    prefill = [(n, p, RATES.forward(n, p)) for n, p in (*plan.prefill, plan.holdout)]
    prefill.append((128, 2048, RATES.forward(128, 2048)))  # one after a cached past fits too
    decode = [(k, r, RATES.d0 + RATES.d_row * (r - 1) + RATES.d1 * r * k) for k, r in plan.decode]
    got = fit(prefill, decode)
    for name in ("a", "b", "c", "d0", "d1", "d_row"):
        assert getattr(got, name) == pytest.approx(getattr(RATES, name), rel=1e-6), name
    assert got.floor == 0.0  # a CPU-like device: no launch-bound floor is invented


def test_probe_plan_reaches_the_longest_prompt_and_holds_it_out():
    plan = calibration.probe_plan(32768)
    sizes = [n for n, p in plan.prefill if p == 0]
    assert sizes[0] == 16 and sizes[-1] == 16384 and plan.holdout == (32768, 0)
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))  # doubling
    assert max(k for k, _ in plan.decode) == 32768  # decode at KV lengths up to the longest
    assert any(r > 1 for _, r in plan.decode) and plan.after_cached == (2048, 16384)
    # a tiny window still gets enough probes to fit three terms
    tiny = calibration.probe_plan(64)
    assert len([1 for _, p in tiny.prefill if p == 0]) >= 3 and tiny.holdout == (64, 0)
    # the probed length: a power of two, at least 8k on CUDA, never past the window
    assert calibration.probed_length(5000, 1 << 20, "cpu") == 5120  # a quarter-octave step
    assert calibration.probed_length(4212, 1 << 20, "cpu") == 5120
    assert calibration.probed_length(4096, 1 << 20, "cpu") == 4096
    assert calibration.probed_length(5000, 1 << 20, "cuda") == 8192
    assert calibration.longer_lengths(5120, 8192) == [5120, 6144, 7168, 8192]
    assert calibration.probed_length(100, 1 << 20, "cuda") == 8192
    assert calibration.probed_length(20000, 16384, "cuda") == 16384
    assert calibration.probed_length(None, 1 << 20, "cpu") == 2048


class GpuLikeClock:
    """A device whose forward passes "take" time along an H200-like curve, read off a clock the
    test controls (nothing sleeps): flat 20 ms (launch-bound) until the dense work passes it at
    2k tokens, then linear dense work plus quadratic causal attention; decode steps flat 28 ms
    plus reading the KV cache."""

    def __init__(self) -> None:
        self.clock = 0.0

    @staticmethod
    def curve(new: int, past: int, rows: int) -> float:
        dense = 1e-5 * new * rows  # 20 ms at 2,048 tokens
        attention = 4e-10 * rows * new * (past + (new + 1) / 2)
        if new == 1:  # a decode step: bandwidth-bound on the weights, plus its KV reads
            return 0.028 + 2e-8 * rows * past + 0.001 * (rows - 1)
        return max(0.020, dense + attention)

    def timer(self, new: int, past: int, rows: int, shared: bool) -> float:
        t0 = self.clock
        self.clock += self.curve(new, past, rows)  # the "forward pass"
        return self.clock - t0


def test_calibration_fits_a_launch_bound_gpu_within_10_percent_at_32k():
    """The old model (a + b*n + c*n*p, probes to 512 tokens) put the flat GPU time into ``a``
    and the dense work into ``c``: 2.4x too dear at 16k, 4x at 30k. The new one probes the
    run's lengths and has a floor."""
    device = GpuLikeClock()
    rates = calibration.measure(None, longest=32768, rounds=1, timer=device.timer)
    for n in (1024, 4096, 16384, 32768):
        truth = device.curve(n, 0, 1)
        assert rates.forward(n) == pytest.approx(truth, rel=0.10), n
    assert rates.floor == pytest.approx(0.020, rel=0.05)
    # the held-out 32k probe, predicted from probes up to 16k: the manifest's figure
    check = rates.meta["validation"]
    assert check["tokens"] == 32768 and check["error"] < 0.10
    # a long-context request alone: a 30k prefill then 31 decode steps
    truth = device.curve(30000, 0, 1) + sum(device.curve(1, 30000 + j, 1) for j in range(31))
    assert rates.alone(30000, 32) == pytest.approx(truth, rel=0.10)
    # the decoder's loop takes longer per step than a bare forward pass: d0 follows the loop
    looped = calibration.measure(
        None, longest=32768, rounds=1, timer=device.timer, loop_timer=lambda steps: 0.034
    )
    assert looped.d0 == pytest.approx(0.034 - looped.d1 * calibration.LOOP_KV)
    assert looped.meta["decode_loop_step"] == 0.034
    assert looped.forward(4096) == pytest.approx(rates.forward(4096))
    # and the fit the old probes gave, for the record: it misses by far more than 10% at 32k
    old = fit(
        [(n, 0, device.curve(n, 0, 1)) for n in (16, 128, 512)]
        + [(128, 2048, device.curve(128, 2048, 1))],
        [(k, 1, device.curve(1, k, 1)) for k in (16, 1024, 4096)],
    )
    assert abs(old.forward(32768) / device.curve(32768, 0, 1) - 1) > 0.5


def test_a_poor_fit_warns_once_with_its_figure(capsys):
    rates = Rates(
        a=0.0,
        b=0.001,
        c=0.0,
        d0=0.01,
        d1=0.0,
        meta={
            "path": "/x/poor.json",
            "validation": {"tokens": 8192, "measured": 1.0, "modelled": 1.3, "error": 0.3},
        },
    )
    calibration.warn_validation(rates)
    calibration.warn_validation(rates)
    err = capsys.readouterr().err
    assert err.count("by 30.0%") == 1 and "8,192 tokens" in err
    described = calibration.describe(rates)
    assert described["validation_error"] == 0.3


def test_account_splits_the_calls_device_time_by_stand_alone_cost():
    from ragbench.llm.hf.model import HFModel

    model = object.__new__(HFModel)
    model._rates = RATES
    fields = {
        "text": "",
        "completion_tokens": 8,
        "prefill_seconds": 0.1,
        "decode_seconds": 0.4,
        "queue_seconds": 0.0,
        "prompt_tokens": 0,
        "cached_prompt_tokens": 0,
        "padding_tokens": 0,
        "peak_memory_bytes": None,
        "finish_reason": "length",
        "model": "m",
    }
    prompts = {0: 57, 1: 957, 2: 4000}
    rows = {
        i: {**fields, "prompt_tokens": n, "meta": {"batch_seconds": 1.0}}
        for i, n in prompts.items()
    }
    work = {
        i: {
            "prompt_tokens": n,
            "completion_tokens": 8,
            "prefix_tokens": 0,
            "prefix_computed": True,
            "shared": False,
        }
        for i, n in prompts.items()
    }
    out = model._account(rows, work, [{"index": 0, "padding_tokens": 0}], device=12.0)
    assert sum(c.resource_seconds for c in out) == pytest.approx(12.0)
    factors = [c.resource_seconds / c.meta["alone_seconds_estimate"] for c in out]
    assert factors == pytest.approx([out[0].meta["call"]["batching_factor"]] * 3, rel=1e-3)
    assert out[0].resource_seconds < out[1].resource_seconds < out[2].resource_seconds
    assert "batch_seconds" not in out[0].meta


def test_rates_are_cached_on_disk_by_model_and_device(tmp_path, monkeypatch):
    from ragbench.llm.hf.model import HFModel
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


class CpuLikeClock:
    """A CPU whose passes follow ``RATES`` exactly, read off a clock the test controls; it counts
    the timings of each (new, past, rows) and can add ``spike`` seconds to the first timing of
    one prefill (a neighbour's burst)."""

    def __init__(self, spike_at: int = 0, spike: float = 0.0) -> None:
        self.calls: dict[tuple[int, int, int], int] = {}
        self.spike_at, self.spike = spike_at, spike

    def timer(self, new: int, past: int, rows: int, shared: bool) -> float:
        key = (new, past, rows)
        self.calls[key] = self.calls.get(key, 0) + 1
        if new == 1:
            seconds = RATES.d0 + RATES.d_row * (rows - 1) + RATES.d1 * rows * (past + 1)
        else:
            seconds = RATES.forward(new, past)
        if new == self.spike_at and not past and self.calls[key] == 1:
            seconds += self.spike
        return seconds


def test_a_longer_calibration_times_only_the_probes_a_shorter_one_did_not():
    short = CpuLikeClock()
    first = calibration.measure(None, longest=2048, rounds=1, timer=short.timer)
    longer = CpuLikeClock()
    known = first.meta["samples"]
    second = calibration.measure(None, longest=8192, rounds=1, timer=longer.timer, known=known)
    fresh = calibration.measure(None, longest=8192, rounds=1, timer=CpuLikeClock().timer)
    # the 16..2048-token prefills and the decode steps up to 1k were timed for 2k: not again
    for n in (32, 128, 1024, 2048):
        assert (n, 0, 1) in short.calls and (n, 0, 1) not in longer.calls, n
    assert (1, 1023, 1) not in longer.calls and (1, 15, 4) not in longer.calls
    # only what 2k did not reach (and the warm-up): the 4k and 8k prefills, the check after a
    # cached past, decode steps at 4k and 8k, the shared-prefix probes (at half the length)
    timed = {(4096, 0, 1), (8192, 0, 1), (512, 4096, 1), (1, 4095, 1), (1, 8191, 1), (16, 0, 1)}
    timed |= {(32, 4096, 1), (1, 4096, 1)}
    assert set(longer.calls) == timed
    assert "prefill/2048/0/1" in second.meta["reused"]
    for name in ("a", "b", "c", "d0", "d1", "d_row"):
        assert getattr(second, name) == pytest.approx(getattr(fresh, name), rel=1e-6), name
    assert second.meta["validation"] == fresh.meta["validation"]


def test_a_long_prefill_is_timed_once_unless_it_disagrees_with_the_fit():
    quiet = CpuLikeClock()
    calibration.measure(None, longest=8192, rounds=1, timer=quiet.timer)
    # a long prefill once (most of a calibration's time), a cheap one three times
    assert quiet.calls[(8192, 0, 1)] == quiet.calls[(4096, 0, 1)] == 1
    assert quiet.calls[(64, 0, 1)] == calibration.MAX_SAMPLES
    # a neighbour's burst during the first 4k prefill (+40%): the fit misses it, so it is timed
    # again, and its fastest sample stands for it
    burst = CpuLikeClock(spike_at=4096, spike=0.4 * RATES.forward(4096))
    rates = calibration.measure(None, longest=8192, rounds=1, timer=burst.timer)
    assert burst.calls[(4096, 0, 1)] == 2
    # the held-out 8k prefill, predicted from the burst, missed: timed again too; the others
    # agreed with the fit and were timed once
    assert burst.calls[(8192, 0, 1)] == 2
    assert burst.calls[(2048, 0, 1)] == burst.calls[(1024, 0, 1)] == 1
    assert rates.forward(4096) == pytest.approx(RATES.forward(4096), rel=0.01)
    assert rates.meta["samples"]["prefill/4096/0/1"][0] > 1.3 * RATES.forward(4096)
    assert rates.meta["validation"]["error"] < 0.01


class ShapedClock(CpuLikeClock):
    """A CPU whose 8k prefill takes 30% more than ``RATES`` model (the fit's shape misses it, as
    SmolLM2's 8k prefill on this project's 2-core machine), reporting each prefill's process CPU
    seconds to ``share``: the whole of its 2 threads, or half of it for the first timing of
    ``busy_at`` (a neighbour took a core)."""

    def __init__(self, share: CpuShare, busy_at: int = 0) -> None:
        super().__init__()
        self.share, self.busy_at = share, busy_at

    def timer(self, new: int, past: int, rows: int, shared: bool) -> float:
        seconds = super().timer(new, past, rows, shared) * (1.3 if new == 8192 else 1.0)
        busy = new == self.busy_at and self.calls[(new, past, rows)] == 1
        self.share.record((new, past, rows, shared), seconds, seconds * (1.0 if busy else 2.0))
        return seconds


def test_a_steady_miss_is_the_fits_shape_and_is_not_timed_again():
    steady = ShapedClock(CpuShare(threads=2))
    rates = calibration.measure(
        None, longest=8192, rounds=1, timer=steady.timer, share=steady.share
    )
    # the held-out 8k misses by more than the warning's 10%, but every prefill ran on both of
    # its cores: another timing cannot make it faster, so neither long prefill is timed again
    assert rates.meta["validation"]["error"] > calibration.WARN_ERROR
    assert steady.calls[(8192, 0, 1)] == steady.calls[(4096, 0, 1)] == 1
    assert rates.meta["cpu_share"]["prefill/8192/0/1"] == [1.0]
    # the same miss while a neighbour held a core during the 8k prefill: timed again, as before
    busy = ShapedClock(CpuShare(threads=2), busy_at=8192)
    calibration.measure(None, longest=8192, rounds=1, timer=busy.timer, share=busy.share)
    assert busy.calls[(8192, 0, 1)] == 2
    assert busy.share.shares[(8192, 0, 1, False)] == [0.5, 1.0]
    # without CPU shares (a GPU, or a clock that reports none) a miss is timed again
    blind = ShapedClock(CpuShare(threads=2))
    calibration.measure(None, longest=8192, rounds=1, timer=blind.timer)
    assert blind.calls[(8192, 0, 1)] == 2


def test_the_cache_lends_a_shorter_calibrations_probes(tmp_path, monkeypatch, capsys):
    """rates_for: a run that needs 8k after one that needed 2k times only the probes past 2k."""
    clocks: list[CpuLikeClock] = []
    real = calibration.measure

    def measure(decoder, longest=None, known=None):
        clocks.append(CpuLikeClock())
        return real(None, longest, rounds=1, timer=clocks[-1].timer, known=known)

    key = {"version": calibration.CALIBRATION_VERSION, "weights": "w", "device": "cpu"}
    key |= {"hardware": "test cpu", "threads": 2}
    monkeypatch.setattr(calibration, "calibration_key", lambda d, w, n=None: dict(key))
    monkeypatch.setattr(calibration, "measure", measure)
    monkeypatch.setattr(calibration, "_MEMO", {})
    short = calibration.rates_for(object(), "w", tmp_path, longest=2000)
    assert short.meta["reused"] == [] and "reused" not in capsys.readouterr().err
    with calibration.because("long_context reads a whole example"):
        long = calibration.rates_for(object(), "w", tmp_path, longest=8000)
    err = capsys.readouterr().err
    assert "up to 8,192 tokens (long_context reads a whole example)" in err
    assert f"probes up to 2,048 tokens reused from {short.meta['path']}" in err
    assert long.meta["reused_from"] == short.meta["path"]
    assert (2048, 0, 1) in clocks[0].calls and (2048, 0, 1) not in clocks[1].calls
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 2
    # a window shorter than the run's longest prompt is said
    monkeypatch.setattr(calibration, "window_of", lambda d: 4096)
    monkeypatch.setattr(calibration, "_MEMO", {})
    key["threads"] = 1  # another key: measured again, to the window
    calibration.rates_for(object(), "w", tmp_path, longest=30000)
    assert "up to 4,096 tokens (the model's window is 4,096)" in capsys.readouterr().err
