"""The cost basis: self-hosted dollars from the calibrated model of the hardware (the request's
own tokens x the model's measured rates), not from measured device seconds that follow the
machine's load; ``cost_basis: measured`` keeps the measured charge. Also: calibration shared by
concurrent workers under a lock, and announced."""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import replace

import pytest

from ragbench.cost import Cost
from ragbench.cost.money import Seconds, dollars
from ragbench.cost.prices import (
    modelled_seconds,
    modelled_seconds_for,
    price_sheet,
    work_of,
)
from ragbench.experiment import resources
from ragbench.experiment.config.sections import ModelConfig
from ragbench.experiment.runner import run
from ragbench.llm import calibration
from ragbench.llm.cache import CachedLLM
from ragbench.llm.cost_model import Rates
from ragbench.llm.fake import FakeLLM
from ragbench.strategies.base import Resources
from ragbench.types import Completion

RATES = Rates(a=0.02, b=0.002, c=2e-6, d0=0.06, d1=2e-5, d_row=0.01)
HOURLY = price_sheet("example-cpu-hour")  # $0.08 per hour
API = price_sheet("openai-gpt-4.1-mini")
WORK = {
    "prompt_tokens": 1000,
    "completion_tokens": 8,
    "prefix_tokens": 990,
    "prefix_computed": False,
    "shared": True,
}


def completion(resource_seconds: float, work=WORK, **meta) -> Completion:
    """A transformers-like completion: its own work logged, a measured share of device time."""
    return Completion(
        text="x",
        prompt_tokens=1000,
        cached_prompt_tokens=990,
        completion_tokens=8,
        prefill_seconds=0.1,
        decode_seconds=0.4,
        resource_seconds=resource_seconds,
        meta={**({"work": work} if work is not None else {}), **meta},
    )


def test_calibrated_dollars_follow_tokens_not_the_load():
    quiet, busy = completion(0.5), completion(1.4)  # the same work on a loaded machine
    a, b = Cost.of(quiet, sheet=HOURLY, rates=RATES), Cost.of(busy, sheet=HOURLY, rates=RATES)
    expected = RATES.alone(**WORK)
    assert a.modelled_seconds == b.modelled_seconds == pytest.approx(expected)
    assert a.dollars == b.dollars == pytest.approx(0.08 * expected / 3600)
    assert a.cost_basis == b.cost_basis == "calibrated"
    assert (a.resource_seconds, b.resource_seconds) == (0.5, 1.4)  # measured: its own column


def test_measured_basis_is_todays_charge_exactly():
    busy = completion(1.4)
    today = Cost.of(busy, sheet=HOURLY)  # no calibration: what every run charged before
    measured = Cost.of(busy, sheet=HOURLY, rates=RATES, basis="measured")
    assert measured.dollars == today.dollars == pytest.approx(0.08 * 1.4 / 3600)
    assert measured.cost_basis == today.cost_basis == "measured"
    assert measured.modelled_seconds == pytest.approx(RATES.alone(**WORK))  # shown beside it
    assert today.modelled_seconds is None
    with pytest.raises(ValueError, match="calibrated"):
        Cost.of(busy, sheet=HOURLY, rates=RATES, basis="wallclock")


def test_backends_without_a_calibration_and_token_sheets_are_unaffected():
    server = completion(1.4, work=None)  # a server: no work logged, no rates
    cost = Cost.of(server, sheet=HOURLY, rates=RATES)
    assert cost.modelled_seconds is None and cost.cost_basis == "measured"
    assert cost.dollars == pytest.approx(0.08 * 1.4 / 3600)
    # a token sheet prices tokens whatever the basis
    api = [
        Cost.of(completion(s), sheet=API, rates=RATES, basis=b)
        for s in (0.5, 1.4)
        for b in ("calibrated", "measured")
    ]
    assert len({c.dollars for c in api}) == 1
    # the fake backend: simulated seconds from tokens, no calibration, deterministic
    fake = FakeLLM().generate([Resources(llm=None).request("What is it?")])[0]
    assert work_of(fake) is None and Cost.of(fake, sheet=HOURLY, rates=RATES).cost_basis == (
        "measured"
    )


def test_completions_stored_before_the_work_was_logged_are_modelled_from_tokens():
    old = completion(1.0, work=None, alone_seconds_estimate=0.9)
    assert work_of(old) == {
        "prompt_tokens": 1000,
        "completion_tokens": 8,
        "prefix_tokens": 990,
        "prefix_computed": False,
    }
    assert modelled_seconds(old, RATES) == pytest.approx(modelled_seconds_for(RATES, 1000, 990, 8))
    assert modelled_seconds(old, None) is None
    assert Seconds(1.0, 0.2).charged("calibrated") == 0.2
    assert Seconds(1.0, 0.2).charged("measured") == Seconds(1.0, None).charged("calibrated") == 1.0


def test_sums_reprices_and_one_time_costs_keep_their_basis():
    rag = Cost.of(completion(0.3), sheet=HOURLY, rates=RATES)
    lc = Cost.of(completion(2.0), sheet=HOURLY, rates=RATES)
    both = rag + lc  # Self-Route: two calls
    assert both.modelled_seconds == pytest.approx(2 * RATES.alone(**WORK))
    assert both.cost_basis == "calibrated" and both.dollars == pytest.approx(rag.dollars * 2)
    variant = Cost.of(completion(2.0, work=None), sheet=HOURLY, rates=RATES)
    assert (rag + variant).cost_basis == "mixed" and (rag + variant).modelled_seconds is None
    # repricing an hourly sheet charges the basis the run charged
    pricier = replace(HOURLY, prices={"gpu_hour": 0.8, "gpus": 1.0}, name="x10")
    again = Cost.from_dict(both.to_dict()).repriced(pricier)
    assert again.dollars == pytest.approx(both.dollars * 10)
    measured = Cost.of(completion(2.0), sheet=HOURLY, rates=RATES, basis="measured")
    assert measured.repriced(pricier).dollars == pytest.approx(0.8 * 2.0 / 3600)
    old = Cost.from_dict({"resource_seconds": 2.0})  # written before the basis existed
    assert old.repriced(pricier).dollars == pytest.approx(0.8 * 2.0 / 3600)
    # a one-time cost (a preload) is charged and repriced on the same basis
    once = Cost.of(completion(9.0), sheet=HOURLY, rates=RATES)
    shared = rag.amortise(once, 4)
    assert shared.one_time_seconds == 9.0
    assert shared.one_time_modelled_seconds == pytest.approx(once.modelled_seconds)
    assert shared.amortised_dollars == pytest.approx(rag.dollars + once.dollars / 4)
    re = shared.repriced(pricier)
    assert re.one_time_dollars == pytest.approx(dollars(pricier, seconds=once.modelled_seconds))
    assert re.amortised_dollars == pytest.approx(10 * shared.amortised_dollars)


class LoadedFake(FakeLLM):
    """A FakeLLM with a calibration whose measured seconds follow a machine load factor (what
    the transformers backend does), and that logs its requests' own work."""

    load = 1.0

    def cost_rates(self, longest: int | None = None) -> Rates:
        return replace(RATES, meta={"key": {"weights": "fake", "threads": 1}, "path": "p.json"})

    def _generate(self, requests):
        out = super()._generate(requests)
        return [
            replace(
                c,
                resource_seconds=self.load * (c.prefill_seconds + c.decode_seconds),
                meta={
                    **c.meta,
                    "work": {
                        "prompt_tokens": c.prompt_tokens,
                        "completion_tokens": c.completion_tokens,
                        "prefix_tokens": c.cached_prompt_tokens,
                        "prefix_computed": False,
                    },
                },
            )
            for c in out
        ]


def _config(tmp_path, name: str, basis: str | None = None) -> dict:
    cfg = {
        "name": name,
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [300, 900],
                "depth_percents": [50],
                "tokenizer": "whitespace",
            },
        },
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {"embedder": "hash"},
        "strategies": [
            "closed_book",
            "long_context",
            {"name": "rag", "params": {"top_k": 2}},
            "self_route",
        ],
        "price_sheet": "example-cpu-hour",
        "output_dir": str(tmp_path),
    }
    return {**cfg, "cost_basis": basis} if basis else cfg


@pytest.mark.parametrize("basis", ["calibrated", "measured"])
def test_a_run_on_a_loaded_machine_costs_the_same_calibrated(tmp_path, basis):
    tables = []
    for load in (1.0, 3.0):
        llm = LoadedFake()
        llm.load = load
        cfg = _config(tmp_path / str(load), "basis", basis)
        tables.append(run(cfg, progress=False, llm=CachedLLM(llm, tmp_path / f"{load}.sqlite")))
    quiet, busy = tables
    assert (busy["resource_seconds"] > quiet["resource_seconds"]).all()  # the load, measured
    assert quiet["modelled_seconds"].tolist() == busy["modelled_seconds"].tolist()
    if basis == "calibrated":
        assert quiet["dollars"].tolist() == busy["dollars"].tolist()
        assert set(quiet["cost_basis"]) == {"calibrated"}
    else:
        assert busy["dollars"].sum() == pytest.approx(3 * quiet["dollars"].sum())
        assert set(quiet["cost_basis"]) == {"measured"}
    manifest = json.loads((next((tmp_path / "1.0").iterdir()) / "manifest.json").read_text())
    assert manifest["cost_basis"] == basis
    assert manifest["calibration"]["key"] == {"weights": "fake", "threads": 1}
    assert manifest["calibration"]["rates"]["b"] == RATES.b
    # resumed with nothing to do: no model, the calibration it priced with is kept
    run(_config(tmp_path / "1.0", "basis", basis), progress=False, llm=None)
    again = json.loads((next((tmp_path / "1.0").iterdir()) / "manifest.json").read_text())
    assert again["calibration"] == manifest["calibration"]


def test_rates_of_reads_through_the_completion_cache(tmp_path):
    assert resources.rates_of(CachedLLM(LoadedFake(), tmp_path / "c.sqlite")).b == RATES.b
    assert resources.rates_of(FakeLLM()) is None


# ------------------------------------------------------------------ calibration: shared, announced


def _worker(cache_dir: str, log: str, out: str) -> None:
    rates = calibration.rates_for(object(), "w", cache_dir)
    with open(out, "a") as f:
        f.write(json.dumps(rates.b) + "\n")


def _slow_measure(log: str):
    def measure(decoder, longest=None, **_):
        with open(log, "a") as f:
            f.write("measured\n")
        time.sleep(0.5)
        return replace(RATES, meta={"measured_at": "now"})

    return measure


KEY = {
    "version": calibration.CALIBRATION_VERSION,
    "weights": "w",
    "device": "cpu",
    "hardware": "test cpu",
    "dtype": "float32",
    "attention": "sdpa",
    "threads": 2,
    "packed_linear": False,
    "torch": "x",
    "transformers": "y",
}


def test_concurrent_workers_calibrate_once_under_the_lock(tmp_path, monkeypatch):
    """A sweep's workers on one machine: the first measures, the others wait and read its file."""
    log, out = tmp_path / "measured.log", tmp_path / "out.log"
    monkeypatch.setattr(calibration, "calibration_key", lambda d, w, n=None: dict(KEY))
    monkeypatch.setattr(calibration, "measure", _slow_measure(str(log)))
    monkeypatch.setattr(calibration, "_MEMO", {})
    ctx = multiprocessing.get_context("fork")  # the patched functions travel with the fork
    workers = [
        ctx.Process(target=_worker, args=(str(tmp_path), str(log), str(out))) for _ in range(3)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert log.read_text().splitlines() == ["measured"]  # once, not once per worker
    assert out.read_text().splitlines() == [json.dumps(RATES.b)] * 3
    files = list((tmp_path / "calibration").glob("*.json"))
    assert len(files) == 1 and not list((tmp_path / "calibration").glob("*.tmp"))


def test_calibration_is_announced_with_its_cache_and_found_by_a_dry_run(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(calibration, "calibration_key", lambda d, w, n=None: dict(KEY))
    monkeypatch.setattr(calibration, "measure", _slow_measure(str(tmp_path / "m.log")))
    monkeypatch.setattr(calibration, "_MEMO", {})
    rates = calibration.rates_for(object(), "w", tmp_path)
    err = capsys.readouterr().err
    assert (
        "calibrating w on test cpu (2 threads) up to 2,048 tokens" in err and str(tmp_path) in err
    )
    assert "once per model/device/dtype/thread count/length" in err
    assert rates.meta["path"].startswith(str(tmp_path / "calibration"))
    described = calibration.describe(rates)
    assert described["key"]["threads"] == 2 and described["rates"]["a"] == RATES.a
    # a dry run finds it without loading the model, by what it knows
    found = calibration.cached_rates({"weights": "w", "threads": 2}, tmp_path)
    assert found is not None and found.b == RATES.b
    assert calibration.cached_rates({"weights": "w", "threads": 1}, tmp_path) is None
    monkeypatch.setattr(calibration, "_MEMO", {})  # a new process reads the file, silently
    calibration.rates_for(object(), "w", tmp_path)
    assert "calibrating" not in capsys.readouterr().err


def test_loading_a_model_is_announced(monkeypatch, capsys):
    monkeypatch.setattr(resources, "load_llm", lambda backend, **kw: FakeLLM())
    model = ModelConfig(backend="hf", name="smollm2-135m-instruct", cache=False)
    resources.load_model(model)
    err = capsys.readouterr().err
    assert "loading model smollm2-135m-instruct (hf)" in err and "loaded model" in err
    resources.load_model(ModelConfig(backend="fake", name="fake", cache=False))
    assert "loading" not in capsys.readouterr().err  # no weights, nothing to wait for


def test_reprice_charges_a_calibrated_record_its_modelled_seconds_and_a_measured_one_its_own():
    from ragbench.cost.prices import price_sheet
    from ragbench.cost.reprice import _repriced

    sheet = price_sheet("example-cpu-hour")
    logged = {
        "prompt_tokens": 900,
        "cached_prompt_tokens": 0,
        "completion_tokens": 8,
        "resource_seconds": 40.0,
        "modelled_seconds": 2.0,
    }
    calibrated = _repriced(sheet, {**logged, "cost_basis": "calibrated"})
    measured = _repriced(sheet, {**logged, "cost_basis": "measured"})
    assert measured.dollars > 0  # an hourly sheet: dollars in proportion to the seconds charged
    assert calibrated.dollars == pytest.approx(measured.dollars * 2.0 / 40.0)


def test_a_longer_run_calibrates_again_and_a_shorter_one_reads_the_longer(tmp_path, monkeypatch):
    """The key names the probed length: rates probed to 2k do not price an 8k prompt."""
    log = tmp_path / "m.log"
    monkeypatch.setattr(calibration, "calibration_key", lambda d, w, n=None: dict(KEY))
    monkeypatch.setattr(calibration, "measure", _slow_measure(str(log)))
    monkeypatch.setattr(calibration, "_MEMO", {})
    short = calibration.rates_for(object(), "w", tmp_path, longest=1500)
    assert short.meta["key"]["probed_tokens"] == 1536  # quarter-octave steps
    long = calibration.rates_for(object(), "w", tmp_path, longest=7000)
    assert long.meta["key"]["probed_tokens"] == 7168 and log.read_text().count("measured") == 2
    monkeypatch.setattr(calibration, "_MEMO", {})
    again = calibration.rates_for(object(), "w", tmp_path, longest=3000)  # the 7k one serves
    assert again.meta["key"]["probed_tokens"] == 7168 and log.read_text().count("measured") == 2
