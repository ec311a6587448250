"""``max_dollars``: the dry run refuses a config estimated over it (exit 2, with the estimate); a
fake-backend run priced by a sheet stops at the cap with its own exit code and one line, and a
rerun with a higher cap resumes it in the same folder, redoing nothing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from openai_server import ok, send_json, serving, user_text
from test_runner import niah_config
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.cost.accounting import Cost
from ragbench.datasets.corpus.shared import write_essay_corpus
from ragbench.experiment.budget import (
    BUDGET_EXIT,
    Budget,
    Counted,
    RoundBound,
    Spend,
    decide,
    over_budget,
    preload_estimate,
    spend_of,
)
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.results import RECORDS, read_records
from ragbench.experiment.runner import run, run_dir_for
from ragbench.llm.fake import FakeLLM
from ragbench.strategies import LongContextParams
from ragbench.types import Example, Record


def config(tmp_path, out: str = "results", **over):
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context"], **over)
    cfg["dataset"]["params"]["depth_percents"] = [10, 50, 90]  # 6 examples: 12 records
    cfg["model"]["batch_size"] = 2  # 6 rounds
    cfg["output_dir"] = str(tmp_path / out)
    return cfg


def write(tmp_path, cfg, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def invoke(*args):
    return CliRunner().invoke(app, ["run", *map(str, args), "--quiet"])


def record(dollars=None, judge=None):
    return SimpleNamespace(cost=SimpleNamespace(dollars=dollars), meta={"judge_dollars": judge})


# ---------------------------------------------------------------------------- pure rules


def test_spend_counts_generation_and_judge_dollars():
    spend = spend_of([record(1.0, 0.5), record(3.0), SimpleNamespace(cost=None, meta={})])
    assert spend == Spend(dollars=4.5, per_record=2.0, judge_per_record=0.5)


def preloaded(example_id, own, once, corpus="c1", over=12):
    """A long_context preload record: ``own`` dollars, a one-time cost of ``once`` beside."""
    cost = Cost(resource_seconds=0.1, dollars=own)
    cost = cost.amortise(Cost(resource_seconds=1.0, dollars=once), over)
    return Record(example_id, "long_context", LongContextParams(preload=True), "x", cost=cost)


def test_spend_counts_a_preloads_one_time_cost_once():
    # each record carries its group's one-time cost: counted once per group, not per record (it
    # was not counted at all: a $4e-6 cap let $2.5e-5 through), and not in the per-record mean
    meta = {
        "q1": {"corpus_fingerprint": "c1"},
        "q2": {"corpus_fingerprint": "c1"},
        "q3": {"corpus_fingerprint": "c2"},
    }
    records = [
        preloaded("q1", 1.0, 10.0),
        preloaded("q2", 1.0, 10.0),
        preloaded("q3", 1.0, 4.0, "c2"),
        record(2.0),
    ]
    spend = spend_of(records, meta)
    assert spend.dollars == pytest.approx(5.0 + 10.0 + 4.0)
    assert spend.per_record == pytest.approx(1.25)
    assert sorted(spend.one_time.values()) == [4.0, 10.0]
    # a round with a corpus not preloaded yet: its preload at the mean one-time cost so far
    q4 = Example("q4", "?", ("a",), (), meta={"corpus_fingerprint": "c3"})
    q1 = Example("q1", "?", ("a",), (), meta=meta["q1"])
    pre = LongContextParams(preload=True)
    assert preload_estimate(spend, [(q4, pre), (q4, pre)]) == pytest.approx(7.0)
    assert preload_estimate(spend, [(q1, pre), (q4, LongContextParams())]) == 0.0
    assert preload_estimate(spend_of([record(1.0)]), [(q4, pre)]) == 0.0  # nothing to go by


def test_decide_stops_before_a_round_expected_to_pass_the_cap():
    assert decide(spent=5.0, estimate=4.0, cap=10.0) is None
    assert decide(spent=5.0, estimate=5.0, cap=10.0) is None  # exactly at the cap: allowed
    assert decide(spent=5.0, estimate=5.1, cap=10.0) == "next round would pass it"
    assert decide(spent=10.0, estimate=0.0, cap=10.0) == "reached"


def test_rounds_in_flight_count_at_their_estimate():
    # $1 per record so far, $2 spent, a $5 cap: an executor that takes rounds before the earlier
    # ones finish (Ray) gets three more single-record rounds, not an unbounded number
    budget = Budget(5.0)
    done = {"a": record(1.0), "b": record(1.0)}
    rounds = [[((None, None), k)] for k in "cdefg"]
    handed = list(budget.rounds(rounds, done))  # none of them finishes meanwhile
    assert [r[0][1] for r in handed] == ["c", "d", "e"]
    assert budget.stopped == "budget" and budget.info["records_left"] == 2
    assert budget.info["next_round_estimate"] == 4.0  # the round, plus the three in flight
    assert "spent $2.000000 of max_dollars $5.000000" in budget.reason


def test_passes_after_generation_are_held_to_the_cap_chunk_by_chunk():
    done = {"a": record(1.0, 0.5), "b": record(1.0, 0.5)}  # spent 3.0; judge 0.5 per record
    judge = Budget(max_dollars=4.2)
    two, three = [record(1.0)] * 2, [record(1.0)] * 3
    assert judge.allows(done, two, 10, "judge")  # 3.0 + 2 x 0.5 = 4.0 fits
    assert not judge.allows(done, three, 10, "judge")  # 3.0 + 1.5 would pass 4.2
    assert judge.info["pass"] == "judge" and judge.pending_at_stop == 0
    assert "10 record(s) left in the judge pass" in judge.reason
    assert not judge.allows(done, [record(1.0)], 9, "judge")  # once stopped, no pass runs
    # the noise pass: its own mean once it has one, else the chunk's own generation dollars
    assert not Budget(max_dollars=4.5).allows(done, two, 2, "noise")  # 3.0 + 2 x 1.0
    assert Budget(max_dollars=4.5).allows(done, [record(0.5)] * 2, 2, "noise")  # 3.0 + 1.0
    noisy = {"a": SimpleNamespace(cost=SimpleNamespace(dollars=1.0), meta={"noise_dollars": 0.1})}
    assert Budget(max_dollars=1.25).allows(noisy, [record(1.0)], 1, "noise")  # 1.1 + 0.1
    assert spend_of(noisy.values()).dollars == pytest.approx(1.1)
    assert Budget(max_dollars=None).allows(done, three * 30, 100, "judge")


def test_over_budget_names_the_estimate():
    assert over_budget(0.5, 1.0) is None and over_budget(2.0, None) is None
    assert over_budget(float("nan"), 1.0) is None  # nothing estimated: nothing to refuse
    assert "$2.000000, over max_dollars $1.000000" in over_budget(2.0, 1.0)


def test_max_dollars_needs_a_price_sheet_and_keeps_the_run_folder(tmp_path):
    cfg = config(tmp_path)
    capped = load_config({**cfg, "max_dollars": 0.01})
    assert config_hash(capped) == config_hash(load_config(cfg))  # a higher cap resumes here
    with pytest.raises(ConfigError, match="max_dollars needs dollars.*price_sheet"):
        load_config({**cfg, "price_sheet": None, "max_dollars": 0.01})
    with pytest.raises(ConfigError, match="greater than 0"):
        load_config({**cfg, "max_dollars": 0})


# ---------------------------------------------------------------------------- the dry run


def test_dry_run_refuses_a_config_estimated_over_the_cap(tmp_path):
    path = write(tmp_path, config(tmp_path))
    fits = invoke(path, "--dry-run", "--max-dollars", 100)
    assert fits.exit_code == 0, fits.output
    over = invoke(path, "--dry-run", "--max-dollars", 0.000001)
    assert over.exit_code == 2, over.output
    assert "total: at most $" in over.output  # the table and its estimate come first
    last = over.output.strip().splitlines()[-1]
    assert last.startswith("error: dry run of t-niah: estimated at most $"), last
    assert "over max_dollars $0.000001" in last
    assert not (tmp_path / "results").exists()  # nothing written


# ---------------------------------------------------------------------------- a live run


def test_run_stops_at_the_cap_then_resumes_with_a_higher_one(tmp_path):
    full = run(config(tmp_path, out="full"), progress=False)
    total = float(full["dollars"].sum())
    assert len(full) == 12 and total > 0

    cfg = config(tmp_path)
    path = write(tmp_path, cfg)
    cap = total / 2
    stopped = invoke(path, "--max-dollars", repr(cap))
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    lines = [x for x in stopped.output.splitlines() if "stopped: budget" in x]
    assert len(lines) == 1 and "rerun with a higher --max-dollars" in lines[0], stopped.output

    out = run_dir_for(load_config(cfg))
    first = (out / RECORDS).read_text().splitlines()
    assert 0 < len(first) < 12
    done = read_records(out / RECORDS)
    spent = spend_of(done.values()).dollars
    assert spent < total
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "stopped" and manifest["records"] == len(first)
    session = manifest["sessions"][-1]
    assert session["stopped"] == "budget"
    info = session["budget"]
    assert info["spent_dollars"] == pytest.approx(spent, abs=1e-6)
    # it stopped for the reason it gives: the next round was expected to pass the cap
    assert info["spent_dollars"] + info["next_round_estimate"] > cap
    assert info["records_left"] == 12 - len(first)
    assert len(pd.read_parquet(out / "results.parquet")) == len(first)  # the table so far

    resumed = invoke(path, "--max-dollars", repr(total * 10))
    assert resumed.exit_code == 0, resumed.output
    after = (out / RECORDS).read_text().splitlines()
    assert after[: len(first)] == first  # nothing redone: the first session's lines stand
    keys = [json.loads(line)["key"] for line in after]
    assert len(after) == 12 and len(set(keys)) == 12  # every record once
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert [s.get("stopped") for s in manifest["sessions"]] == ["budget", None]
    assert manifest["resumed_records"] == len(first)
    assert spend_of(read_records(out / RECORDS).values()).dollars == pytest.approx(total)


def test_the_noise_pass_is_held_to_the_cap_and_resumes(tmp_path):
    """The noise pass answers again after generation: its calls count, chunk by chunk."""
    from test_noise import config as noise_config

    cfg = noise_config(tmp_path) | {"strategies": [{"name": "rag", "params": {"top_k": 2}}]}
    cfg |= {"price_sheet": "example-hosted-api", "model": cfg["model"] | {"batch_size": 2}}
    full = run(cfg | {"output_dir": str(tmp_path / "full")}, progress=False)
    generation = float(full["dollars"].sum())
    noise = float(full["noise_dollars"].sum())
    assert generation > 0 and noise > 0 and full["noise_sensitivity"].notna().all()
    # room for the generation and about half the noise pass
    stopped = run(cfg | {"max_dollars": generation + noise / 2}, progress=False)
    assert "in the noise pass" in stopped.attrs["stopped"]
    out = Path(stopped.attrs["run_dir"])
    done = read_records(out / RECORDS)
    measured = sum("noise_sensitivity" in r.scores for r in done.values())
    assert 0 < measured < len(done) == 8
    # it can pass the cap only by what its last chunk (2 records) cost beyond the estimate
    assert (
        spend_of(done.values()).dollars <= generation + noise / 2 + 2 * full["noise_dollars"].max()
    )
    session = json.loads((out / "manifest.json").read_text())["sessions"][-1]
    assert session["budget"]["pass"] == "noise" and session["pending"] == 8  # all generated
    assert session["noised"] == measured  # what it answered again, not what it planned
    resumed = run(cfg | {"max_dollars": (generation + noise) * 2}, progress=False)
    assert "stopped" not in resumed.attrs and resumed["noise_sensitivity"].notna().all()
    cols = ["example_id", "noise_sensitivity", "noise_distractor_ids"]
    assert (
        resumed.sort_values("example_id")[cols]
        .reset_index(drop=True)
        .equals(full.sort_values("example_id")[cols].reset_index(drop=True))
    )


# ---------------------------------------------------------------------------- the first round

serve = pytest.fixture(serving, name="serve")


def test_a_tiny_cap_stops_before_the_first_round_naming_its_estimate(tmp_path):
    path = write(tmp_path, config(tmp_path))
    stopped = invoke(path, "--max-dollars", "0.000001")
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    line = next(x for x in stopped.output.splitlines() if "stopped: budget" in x)
    assert "spent $0.000000 of max_dollars $0.000001" in line
    assert "the first round would pass it (estimated at most $" in line
    out = run_dir_for(load_config(path))
    assert not (out / RECORDS).exists() or not (out / RECORDS).read_text()  # nothing spent
    info = json.loads((out / "manifest.json").read_text())["sessions"][-1]["budget"]
    assert info["why"] == "first round would pass it" and info["records_left"] == 12
    # the estimate is the dry run's bound for the first round's two records
    dry = invoke(path, "--dry-run")
    assert dry.exit_code == 0 and info["next_round_estimate"] > 0.000001


def test_a_tiny_cap_on_a_server_sends_no_request(tmp_path, serve):
    srv = serve(ok())
    cfg = config(tmp_path)
    cfg["model"] = {
        "backend": "openai",
        "name": "m",
        "cache": False,
        "batch_size": 32,
        "params": {"base_url": srv.url, "max_retries": 0},
    }
    path = write(tmp_path, cfg)
    stopped = invoke(path, "--max-dollars", "0.000001")
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    assert "the first round would pass it (estimated at most $" in stopped.output
    assert srv.requests == []  # was: the whole first round of 12 sent ($0.000335 at batch 32)
    # a cap above the bound runs it all
    done = invoke(path, "--max-dollars", "100")
    assert done.exit_code == 0, done.output
    assert len(srv.requests) == 12


def at_most(*dollars, preloads=None):
    """A ``Budget.bound`` that counts each item at ``dollars`` (cycled), as the dry run would."""
    return lambda items: RoundBound(
        tuple(dollars[i % len(dollars)] for i in range(len(items))), preloads or {}
    )


def test_the_first_round_bound_holds_rounds_handed_out_before_any_finishes():
    budget = Budget(5.0, bound=at_most(2.0))  # $2 per record at most
    rounds = [[((None, None), k)] for k in "abcde"]
    handed = list(budget.rounds(rounds, {}))  # none finishes meanwhile (Ray)
    assert [r[0][1] for r in handed] == ["a", "b"]  # a third would make $6 in flight
    assert budget.info["why"] == "next round would pass it"
    assert budget.info["next_round_estimate"] == 6.0
    first = Budget(1.0, bound=at_most(2.0))
    assert list(first.rounds(rounds, {})) == []
    assert first.info["why"] == "first round would pass it" and first.info["records_left"] == 5
    # no estimate (no sheet dollars): the first round runs, as before
    assert len(list(Budget(1.0, bound=lambda items: None).rounds(rounds[:1], {}))) == 1


def preload_config(tmp_path, sheet, **model):
    corpus = write_essay_corpus(
        tmp_path / "corpus", questions=6, tokens=900, tokenizer="whitespace"
    )
    return {
        "name": "pre",
        "dataset": {
            "name": "corpus",
            "params": {"corpus": str(corpus[0]), "questions": str(corpus[1])},
        },
        "model": {"backend": "fake", "name": "fake", "cache": False, "batch_size": 2, **model},
        "strategies": [{"name": "long_context", "params": {"preload": True}}],
        "metrics": ["string_match_all"],
        "price_sheet": sheet,
        "output_dir": str(tmp_path / "runs"),
    }


def test_a_preloads_one_time_cost_counts_in_the_spend(tmp_path):
    # the fake has no calibration: on an hourly sheet the first round runs unestimated, and its
    # preload alone passes the cap. The spend said $0.000004 of a $0.000004 cap after 4 records
    # (each record's own dollars); it was 4 x $9.8e-7 + the $2.08e-5 preload
    cfg = preload_config(tmp_path, "example-cpu-hour")
    cfg["max_dollars"] = 0.000004
    df = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1))
    real = df["dollars"].sum() + df["one_time_dollars"].iloc[0]
    assert df["one_time_dollars"].iloc[0] > cfg["max_dollars"]
    info = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())["sessions"][-1]
    assert info["budget"]["why"] == "reached" and len(df) == 2  # stopped after that round
    assert info["budget"]["spent_dollars"] == pytest.approx(real, abs=1e-6)
    passed = f"passed it by ${real - 0.000004:,.6f}"  # was "reached it": it went past it
    assert f"spent ${real:,.6f} of max_dollars $0.000004, {passed}" in df.attrs["stopped"]
    assert df["amortised_dollars"].sum() == pytest.approx(real)  # the table agrees


def test_the_first_round_estimate_counts_the_preload(tmp_path, monkeypatch):
    # an api sheet: the first round is estimated as the dry run counts it, now with the preload
    # call it sends before its questions. Counted as a backend that keeps prefixes (transformers)
    # is, the questions find the corpus cached; without the preload the estimate was about half
    # of what the round cost. One new token: the fake's answers are that long, so the bound is
    # the cost itself
    import dataclasses

    from ragbench.experiment import dry_run
    from ragbench.llm import backend_capabilities

    keeps = dataclasses.replace(backend_capabilities("fake"), reuses_prefix_kv=True)
    monkeypatch.setattr(dry_run, "backend_capabilities", lambda name: keeps)
    cfg = preload_config(tmp_path, "example-hosted-api", max_new_tokens=1)
    full = run({**cfg, "name": "full"}, progress=False, llm=FakeLLM(prefix_cache_size=1))
    # the first round is one request (until the model's prompt tokens are known) and its preload
    first_round = full["dollars"].iloc[0] + full["one_time_dollars"].iloc[0]
    cfg["max_dollars"] = first_round * 0.99
    fake = FakeLLM(prefix_cache_size=1)
    df = run(cfg, progress=False, llm=fake)
    assert "the first round would pass it" in df.attrs["stopped"]
    assert fake.calls == 0 and len(df) == 0  # nothing sent
    info = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())["sessions"][-1]
    assert info["budget"]["next_round_estimate"] == pytest.approx(first_round, abs=1e-6)


def test_the_dry_run_holds_the_preload_to_the_cap(tmp_path):
    from ragbench.experiment.dry_run import dry_run

    cfg = preload_config(tmp_path, "example-hosted-api")
    table = dry_run(cfg, progress=False)
    questions = table["dollars_total_max"].sum()
    (note,) = [n for n in table.attrs["notes"] if "preload" in n]
    assert "1 preload call(s)" in note and table.attrs["over_budget"] is None
    # a cap the questions fit under, their preload not (the preload was left out of the total)
    table = dry_run({**cfg, "max_dollars": questions * 1.01}, progress=False)
    assert "over max_dollars" in table.attrs["over_budget"]


# ---------------------------------------------------------------------------- every round


def test_each_round_is_estimated_by_its_own_records_not_the_mean_so_far():
    # short rounds first, then long ones (a NIAH grid): the long round was estimated at the
    # short rounds' mean ($0.001 x 2) and let through; it is bounded by its own prompts now
    long = {"c", "d"}
    bound = lambda items: RoundBound(tuple(1.0 if e == "long" else 0.001 for e, _ in items))  # noqa: E731
    budget = Budget(0.5, bound=bound)
    rounds = [
        [(("short", None), "a"), (("short", None), "b")],
        [(("long", None), k) for k in sorted(long)],
    ]
    done: dict = {}
    handed = []
    for chunk in budget.rounds(rounds, done):
        handed.append(chunk)
        done.update({k: record(0.001) for _, k in chunk})
    assert len(handed) == 1 and budget.info["why"] == "next round would pass it"
    assert budget.info["next_round_estimate"] == pytest.approx(2.0)
    assert "the next round (~$2.000000) would pass it; 2 record(s) left" in budget.reason


def test_records_that_cost_more_than_their_bound_scale_the_next_estimates_up_never_down():
    rounds = [[((None, None), k)] for k in "abc"]
    over = Budget(10.0, bound=at_most(1.0))
    done: dict = {}
    for chunk in over.rounds(rounds, done):  # each record cost 3x its bound (a tokenizer that
        done.update({k: record(3.0) for _, k in chunk})  # undercounts the server's)
    assert list(done) == ["a", "b", "c"]  # $3 + $3 (estimated 3) + $3 (estimated 3) = 9
    stop = Budget(8.0, bound=at_most(1.0))
    done = {}
    for chunk in stop.rounds(rounds, done):
        done.update({k: record(3.0) for _, k in chunk})
    assert list(done) == ["a", "b"] and stop.info["next_round_estimate"] == pytest.approx(3.0)
    under = Budget(1.05, bound=at_most(1.0))  # cheaper answers do not lower the bound
    done = {}
    for chunk in under.rounds(rounds, done):
        done.update({k: record(0.1) for _, k in chunk})
    assert list(done) == ["a"] and under.info["next_round_estimate"] == pytest.approx(1.0)


def test_a_spend_that_is_not_a_number_stops_the_run():
    # NaN passes no comparison: a run priced at NaN (an .inf price) ran uncapped
    assert decide(float("nan"), 1.0, 10.0) == "not a number"
    assert decide(1.0, float("nan"), 10.0) == "not a number"
    budget = Budget(1.0)
    rounds = [[((None, None), k)] for k in "bcd"]
    assert list(budget.rounds(rounds, {"a": record(float("nan"))})) == []
    assert budget.info["why"] == "not a number" and budget.info["spent_dollars"] is None
    assert "is not a number (NaN dollars), so max_dollars $1.000000 cannot be held" in (
        budget.reason
    )
    json.dumps(budget.info, allow_nan=False)  # the manifest's entry stays JSON
    last = Budget(1.0).passed({"a": record(float("nan"))})  # the last round's records, NaN
    assert "the spend is not a number (NaN dollars), so max_dollars $1.000000 could not" in last
    nan_bound = Budget(1.0, bound=at_most(float("nan")))  # refused before anything is sent
    assert list(nan_bound.rounds(rounds, {})) == [] and nan_bound.info["why"] == "not a number"


def test_a_spend_over_the_cap_that_no_check_stopped_is_said():
    budget = Budget(1.0, bound=at_most(0.5))
    done: dict = {}
    for chunk in budget.rounds([[((None, None), "a")]], done):
        done.update({k: record(2.5) for _, k in chunk})
    line = budget.passed(done)
    assert line.startswith("over budget: spent $2.500000 of max_dollars $1.000000, passed it ")
    assert "by $1.500000" in line and budget.info["why"] == "passed it"
    assert Budget(5.0).passed(done) is None and Budget(None).passed(done) is None


def charged(prompt_per_word: int = 1, answer: int | None = None):
    """A server that charges what the prompt's words (times ``prompt_per_word``: a server that
    reports more prompt tokens than the configured tokenizer counts, or lies) and a full
    ``max_tokens`` answer come to (``answer``: that many tokens, if fewer): the tester's
    loopback server."""

    def behave(h, body, n):
        most = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        most = min(most, answer or most)
        use = {
            "prompt_tokens": prompt_per_word * len(user_text(body).split()),
            "completion_tokens": most,
        }
        msg = {
            "message": {"role": "assistant", "content": " ".join(["4444444"] * most)},
            "finish_reason": "length",
        }
        send_json(h, 200, {"model": body["model"], "choices": [msg], "usage": use})

    return behave


def short_then_long(tmp_path, url, **model):
    return {
        "name": "bud2",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [300, 6000],
                "depth_percents": [10, 30, 50, 70, 90],
                "needle": "\nThe special magic number is 4444444.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "4444444",
                "tokenizer": "whitespace",
            },
        },
        "model": {
            "backend": "openai",
            "name": "m",
            "max_new_tokens": 16,
            "batch_size": 5,
            "cache": False,
            **model,
            "params": {"base_url": url, "max_concurrency": 2, "tokenizer": "whitespace"},
        },
        "strategies": ["long_context"],
        "metrics": ["contains"],
        "price_sheet": "openai-gpt-4.1",
        "output_dir": str(tmp_path / "runs"),
    }


def test_a_long_context_round_after_short_ones_is_held_to_the_cap(tmp_path, serve):
    # the tester's run: five 300-token questions ($0.0019), then five 6,000-token ones estimated
    # at 5 x the mean so far and sent: $0.0608 against a $0.01 cap, exit 0, no message
    srv = serve(charged())
    path = write(tmp_path, short_then_long(tmp_path, srv.url))
    stopped = invoke(path, "--max-dollars", "0.01")
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    assert len(srv.requests) == 5  # the short round only
    out = run_dir_for(load_config(path))
    spent = spend_of(read_records(out / RECORDS).values()).dollars
    assert spent <= 0.01
    info = json.loads((out / "manifest.json").read_text())["sessions"][-1]["budget"]
    assert info["why"] == "next round would pass it" and info["records_left"] == 5
    assert spent + info["next_round_estimate"] > 0.05  # the long round's own bound, ~$0.059
    line = next(x for x in stopped.output.splitlines() if "stopped: budget" in x)
    assert "the next round (~$0.0589" in line, line


def spent_in(path) -> float:
    return spend_of(read_records(run_dir_for(load_config(path)) / RECORDS).values()).dollars


def test_a_server_that_counts_more_than_the_tokenizer_is_measured_on_one_request(tmp_path, serve):
    # three tokens a word where the configured tokenizer counts one: the round of five was
    # bounded at ~$0.0019 and sent whole, costing ~$0.0049 against a $0.003 cap ("passed it").
    # Now its first request goes alone; the next is priced at the prompt tokens it charged
    srv = serve(charged(prompt_per_word=3))
    cfg = short_then_long(tmp_path, srv.url, batch_size=10)
    cfg["dataset"]["params"]["context_lengths"] = [300]
    path = write(tmp_path, cfg)
    stopped = invoke(path, "--max-dollars", "0.003")
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    assert "over budget" not in stopped.output and "stopped: budget" in stopped.output
    assert spent_in(path) <= 0.003
    assert 1 < len(srv.requests) < 5  # the first alone, then one at its rate; not the round
    info = json.loads((run_dir_for(load_config(path)) / "manifest.json").read_text())
    assert info["status"] == "stopped" and info["sessions"][-1]["budget"]["records_left"] > 0


def test_a_lying_server_never_takes_the_run_past_its_cap(tmp_path, serve):
    # a server that reports 20 times the prompt tokens: a $5 cap went to $15.95, one round of
    # four requests over. Here a round of five bounded at ~$0.002 cost ~$0.026 against a
    # $0.008 cap; now one request (~$0.0052) shows the rate and the next would pass the cap
    srv = serve(charged(prompt_per_word=20))
    cfg = short_then_long(tmp_path, srv.url)
    cfg["dataset"]["params"]["context_lengths"] = [300]
    path = write(tmp_path, cfg)
    stopped = invoke(path, "--max-dollars", "0.008")
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    (line,) = [x for x in stopped.output.splitlines() if "stopped: budget" in x]
    assert "of max_dollars $0.008000, the next round (~$0.005" in line, line
    assert "(its prompts at the 20x tokens the model charged per token counted so far)" in line
    assert "4 record(s) left" in line and "over budget" not in stopped.output
    assert len(srv.requests) == 1
    spent = spent_in(path)
    assert 0.005 < spent <= 0.008
    # resumed with room for all of it: the rest goes at the measured rate
    done = invoke(path, "--max-dollars", "1")
    assert done.exit_code == 0, done.output
    assert len(srv.requests) == 5 and spent_in(path) == pytest.approx(5 * spent, rel=0.05)


def test_long_prompts_after_short_ones_are_priced_at_the_servers_rate(tmp_path, serve):
    # NIAH, short contexts then long ones, a server that counts 3 tokens a word and answers in
    # 2 tokens of the 256 allowed. The finished records cost less than their bounds (the short
    # answers hid the prompts' undercount), so nothing was scaled and the long round, bounded
    # at ~$0.07, was sent: ~$0.19 against a $0.09 cap (a $5 cap went to $28.11 so). Its
    # prompts are now priced at the prompt tokens charged per counted one: ~$0.19, stopped
    srv = serve(charged(prompt_per_word=3, answer=2))
    path = write(tmp_path, short_then_long(tmp_path, srv.url, max_new_tokens=256))
    stopped = invoke(path, "--max-dollars", "0.09")
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    assert len(srv.requests) == 5  # the short contexts, none of the long ones
    spent = spent_in(path)
    assert spent <= 0.09
    info = json.loads((run_dir_for(load_config(path)) / "manifest.json").read_text())
    budget = info["sessions"][-1]["budget"]
    assert budget["why"] == "next round would pass it" and budget["records_left"] == 5
    assert budget["next_round_estimate"] > 0.18  # 5 x (6,000 words x 3 x $2/M + 256 x $8/M)


def test_rounds_go_one_request_at_a_time_until_the_rate_is_known():
    # each record bounded at $1, $0.10 of it its prompt; the model charges 3 prompt tokens per
    # counted one. The first request goes alone; the next alone again at 3x (the rate went up
    # since its estimate); then whole rounds at that rate
    def price(r):
        return 0.9 + 0.1 * r

    bound = lambda items: RoundBound(  # noqa: E731
        (1.0,) * len(items), counted=(Counted(100, 1, price),) * len(items)
    )
    budget = Budget(100.0, bound=bound)
    rounds = [[((None, None), f"{r}{i}") for i in range(4)] for r in "ab"]
    done: dict = {}
    sizes = []
    for chunk in budget.rounds(rounds, done):
        sizes.append(len(chunk))
        done.update({k: charged_record(1.2, prompt=300) for _, k in chunk})
    assert sizes == [1, 1, 2, 4] and len(done) == 8
    # a cap that holds the first request, not the next at the measured rate ($1.20 each)
    tight = Budget(2.1, bound=bound)
    done = {}
    for chunk in tight.rounds(rounds, done):
        done.update({k: charged_record(1.2, prompt=300) for _, k in chunk})
    assert list(done) == ["a0"] and tight.info["next_round_estimate"] == pytest.approx(1.2)
    assert spend_of(done.values()).dollars <= 2.1
    # a record whose calls the count did not all see (Self-Route's fallback) measures nothing
    fallback = Budget(100.0, bound=bound)
    done, sizes = {}, []
    for chunk in fallback.rounds(rounds, done):
        sizes.append(len(chunk))
        done.update({k: charged_record(5.0, prompt=3_000, calls=2) for _, k in chunk})
    assert sizes == [1, 1, 1, 1, 1, 1, 1, 1]  # never measured: one at a time


def charged_record(dollars, prompt, calls=1):
    cost = SimpleNamespace(dollars=dollars, prompt_tokens=prompt, llm_calls=calls)
    return SimpleNamespace(cost=cost, meta={}, error=None)


def test_a_rounds_bound_counts_its_preload_until_the_group_has_paid_it():
    pre = LongContextParams(preload=True)
    meta = {"corpus_fingerprint": "c1"}
    qs = [Example(f"q{i}", "?", ("a",), (), meta=meta) for i in range(4)]
    group = ("c1", pre.overflow)
    budget = Budget(100.0, bound=at_most(1.0, preloads={group: 5.0}), meta={q.id: meta for q in qs})
    rounds = [[((q, pre), q.id) for q in qs[:2]], [((q, pre), q.id) for q in qs[2:]]]
    done: dict = {}
    for chunk in budget.rounds(rounds, done):
        done.update({k: preloaded(k, 1.0, 5.0, over=4) for _, k in chunk})
    assert len(done) == 4
    small = Budget(7.5, bound=at_most(1.0, preloads={group: 5.0}), meta=budget.meta)
    done = {}
    for chunk in small.rounds(rounds, done):
        done.update({k: preloaded(k, 1.0, 5.0, over=4) for _, k in chunk})
    # round 1: 2 x $1 + its $5 preload = $7 fits $7.5; round 2: $7 spent + 2 x $1 passes it
    # (its corpus is preloaded: not counted again)
    assert len(done) == 2 and small.info["next_round_estimate"] == pytest.approx(2.0)
    first = Budget(6.5, bound=at_most(1.0, preloads={group: 5.0}), meta=budget.meta)
    assert list(first.rounds(rounds, {})) == []  # 2 + 5 > 6.5: the preload counts
    assert first.info["next_round_estimate"] == pytest.approx(7.0)


def test_a_stopped_run_reports_the_rounds_in_flight_it_drained():
    # Ray: the budget stops handing out rounds, the executor drains the ones in flight and their
    # records are written. The spend reported was frozen at the stop ($0.001464 said, $0.003224
    # written); and a drain that passed the cap went unsaid
    budget = Budget(5.0, bound=at_most(2.0))
    rounds = [[((None, None), k)] for k in "abcde"]
    handed = [k for chunk in budget.rounds(rounds, {}) for _, k in chunk]  # none finished yet
    assert handed == ["a", "b"] and budget.info["spent_dollars"] == 0.0
    done = {k: record(2.0) for k in handed}  # then drained
    assert budget.passed(done) is None  # the stop line says it
    assert budget.info["spent_dollars"] == 4.0
    assert "spent $4.000000 of max_dollars $5.000000" in budget.reason
    drained = {k: record(3.0) for k in handed}  # cost more than their bounds: $6 of $5
    assert budget.passed(drained) is None
    assert budget.info["spent_dollars"] == 6.0 and budget.info["passed_by"] == 1.0
    assert "spent $6.000000 of max_dollars $5.000000" in budget.reason
    assert "passed it by $1.000000 with the rounds in flight when it stopped" in budget.reason


def judged(tmp_path, out: str):
    cfg = config(tmp_path, out=out)
    cfg["metrics"] = ["contains", "judge_correct"]
    cfg["judge"] = {
        "model": {"backend": "fake", "name": "fake-judge", "cache": False},
        "price_sheet": "example-hosted-api",
    }
    return cfg


def test_the_judge_pass_of_a_small_run_is_held_to_the_cap(tmp_path):
    # 12 records, one judge chunk: estimated at 12 x the judge's mean per record so far, which is
    # nothing before any is judged, so the whole pass ran: 38% over the cap, blamed on a round
    full = run(judged(tmp_path, "full"), progress=False)
    gen = float(full["dollars"].sum())
    judge = float(full["judge_dollars"].sum())
    assert gen > 0 and judge > 0
    cap = gen + judge / 2
    path = write(tmp_path, judged(tmp_path, "capped"))
    stopped = invoke(path, "--max-dollars", repr(cap))
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    out = run_dir_for(load_config(path))
    done = read_records(out / RECORDS)
    assert spend_of(done.values()).dollars <= cap
    info = json.loads((out / "manifest.json").read_text())["sessions"][-1]["budget"]
    assert info["pass"] == "judge" and 0 < info["records_left"] < 12
    assert "in the judge pass" in stopped.output


def test_a_judge_pass_that_passes_the_cap_is_named():
    budget = Budget(1.0)
    done = {"a": record(0.5, 0.75)}  # generation within the cap, the judge passed it
    line = budget.passed(done)
    assert "passed it by $0.250000" in line and "the judge pass" in line
    assert "a round cost more" not in line


def test_only_the_judge_pass_first_chunk_is_one_record():
    """Under a cap the judge's first chunk is one record until its price is known; a judge that
    never prices (no sheet: judge dollars None) is not taken one record at a time after it."""
    done = {"a": record(0.5, None), "b": record(0.5, None)}
    assert Budget(5.0).judge_chunk(done, 32, first=True) == 1
    assert Budget(5.0).judge_chunk(done, 32, first=False) == 32
    assert Budget(5.0).judge_chunk({"a": record(0.5, 0.1)}, 32, first=True) == 32  # known
    assert Budget(None).judge_chunk(done, 32, first=True) == 32  # no cap
