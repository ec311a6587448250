"""``ragbench run --until-decided`` (the config's ``sequential`` section) on the fake backend:
questions in a seeded order, in rounds, a look after each (the verdict at the look's
group-sequential boundary), stopping when decided or at the budget, every look in the manifest;
a resumed run replays the same looks; a run without the section lands in the same folder and
answers the rest."""

from __future__ import annotations

import json

import pytest
import yaml
from test_runner import niah_config
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.experiment.budget import BUDGET_EXIT
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.results import RECORDS, read_records
from ragbench.experiment.runner import run, run_dir_for
from ragbench.experiment.sequential_run import question_order

RAG = {"name": "rag", "params": {"top_k": 1}}


def config(tmp_path, **over):
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context", RAG], **over)
    cfg["dataset"]["params"]["depth_percents"] = list(range(0, 100, 4))  # 25 x 2 = 50 questions
    return cfg


def write(tmp_path, cfg, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def invoke(*args):
    return CliRunner().invoke(app, ["run", *map(str, args), "--quiet"])


def manifest(tmp_path):
    cfg = load_config(write(tmp_path, config(tmp_path), "m.yaml"))
    return json.loads((run_dir_for(cfg) / "manifest.json").read_text())


def test_it_stops_when_decided_and_the_manifest_records_every_look(tmp_path):
    path = write(tmp_path, config(tmp_path))
    result = invoke(path, "--until-decided")
    assert result.exit_code == 0, result.output
    assert "sequential: decided after 40 of 50 questions (4 looks): recommend long_context" in (
        result.output
    )
    assert "Decided after 40 of 50 questions" in result.output  # the verdict says so
    seq = manifest(tmp_path)["sessions"][-1]["sequential"]
    assert seq["stopped"] == "decided" and seq["planned_looks"] == [10, 20, 30, 40, 50]
    looks = seq["looks"]
    assert [lk["n"] for lk in looks] == [10, 20, 30, 40]
    assert [lk["decision"] for lk in looks] == ["continue"] * 3 + ["recommend long_context"]
    for lk in looks:  # the statistic against the boundary is the decision
        assert (lk["statistic"] >= lk["boundary"]) == (lk["reason"] == "more_accurate")
    assert looks[0]["boundary"] > looks[-1]["boundary"] > 1.96  # O'Brien-Fleming: strict early
    out = run_dir_for(load_config(path))
    assert len(read_records(out / RECORDS)) == 40 * 3  # 10 questions never asked

    # a resumed run replays the looks over its records: nothing generated, the same stop
    again = invoke(path, "--until-decided")
    assert again.exit_code == 0 and "decided after 40 of 50" in again.output
    last = manifest(tmp_path)["sessions"][-1]
    assert last["pending"] == 0 and last["sequential"]["looks"] == looks

    # without it: the same run folder (not in the hash), and it answers the rest
    assert invoke(path).exit_code == 0
    assert len(read_records(out / RECORDS)) == 50 * 3


def test_it_stops_at_the_budget_with_a_last_look(tmp_path):
    # room for the first round's estimate (below it the run stops before any record: no look)
    cfg = config(tmp_path, max_dollars=0.001)
    cfg["sequential"] = {"round_size": 20, "spending": "pocock"}
    result = invoke(write(tmp_path, cfg))
    assert result.exit_code == BUDGET_EXIT, result.output
    session = manifest(tmp_path)["sessions"][-1]
    seq = session["sequential"]
    assert seq["stopped"] == "budget" and seq["planned_looks"] == [20, 40, 50]
    assert seq["looks"][-1]["asked"] < 50
    out = run_dir_for(load_config(write(tmp_path, cfg)))
    answered = len(read_records(out / RECORDS))
    left = session["budget"]["records_left"]
    assert left == 50 * 3 - answered  # every record not written, the later looks' too
    assert f"; {left} record(s) left" in result.output


def test_the_runner_needs_the_look(tmp_path):
    cfg = config(tmp_path)
    cfg["sequential"] = {}
    with pytest.raises(ValueError, match="sequential_look"):
        run(cfg, progress=False)


def test_the_section_is_validated_and_never_hashed(tmp_path):
    plain = load_config(config(tmp_path))
    assert plain.model_dump()["sequential"] is None  # dumped at its default (schema 2)
    for section in ({}, {"rounds": 3, "spending": "pocock", "alpha": 0.1, "seed": 4}):
        assert config_hash(load_config({**config(tmp_path), "sequential": section})) == (
            config_hash(plain)
        )
    for bad, message in (
        ({"round": 3}, "unknown key 'round'"),
        ({"rounds": 3, "round_size": 4}, "not both"),
        ({"spending": "pocok"}, "pocock"),
        ({"alpha": 1.5}, "alpha"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config({**config(tmp_path), "sequential": bad})
    seq = load_config({**config(tmp_path), "sequential": {"round_size": 7}}).sequential
    assert seq.looks(18) == [7, 14, 18] and seq.looks(2) == [2]
    assert load_config({**config(tmp_path), "sequential": {}}).sequential.looks(18) == [
        4,
        7,
        11,
        14,
        18,
    ]


def test_question_order_is_seeded():
    from types import SimpleNamespace

    examples = [SimpleNamespace(id=f"q{i}") for i in range(30)]
    a, b = question_order(examples, 0), question_order(examples, 1)
    assert sorted(a) == sorted(b) == sorted(e.id for e in examples)
    assert a == question_order(examples, 0) and a != b


def test_the_verdict_at_a_look_quotes_the_repeated_interval():
    """The look's verdict: its interval is the repeated one (wider than the fixed design's at
    the same questions), it excludes 0 exactly when the statistic reaches the boundary, and the
    sentence says where the run stopped."""
    from test_verdict import CB, LC, PRICES, RAG, flip, results

    from ragbench.analysis.verdict import sequential_look, verdict

    lc = [1] * 60 + [0] * 40
    df = results({CB: [0] * 100, LC: lc, RAG: flip(lc, ones_to_zero=14)}, PRICES)
    state = {
        "fractions": [0.25, 0.5],
        "spending": "obrien_fleming",
        "questions": 200,
        "answered": 100,
        "stopped": None,
        "alpha": 0.05,
        "margin": 0.05,
        "seed": 0,
    }
    fixed, look = verdict(df), sequential_look(df, state)
    assert fixed.reason == "more_accurate" and fixed.choice == LC
    assert look.ci_high - look.ci_low > fixed.ci_high - fixed.ci_low
    s = look.sequential
    assert s["look"] == 2 and s["comparisons"] == 2 and s["boundary"] > 2.24
    assert (abs(s["z"]) >= s["boundary"]) == (look.ci_low > 0 or look.ci_high < 0)
    assert "repeated 95% CI" in look.text and "against the boundary" in look.text
    assert "Decided after" not in look.text
    done = sequential_look(df, {**state, "stopped": "decided"})
    assert "Decided after 100 of 200 questions (a group-sequential test, O'Brien-Fleming" in (
        done.text
    )
    budget = sequential_look(df, {**state, "stopped": "budget"})
    assert "Stopped at the budget after 100 of 200 questions" in budget.text


def test_variants_that_agree_on_every_question_decide():
    """No discordant pair is no obstacle: the look's interval is Tango's (the fixed verdict's
    at the look's boundary), and 100 agreeing questions show the cheaper one not worse."""
    from test_verdict import LC, PRICES, RAG, results

    from ragbench.analysis.verdict import sequential_look

    df = results({LC: [1] * 100, RAG: [1] * 100}, PRICES)
    state = {
        "fractions": [1 / 3, 2 / 3, 1.0],
        "spending": "obrien_fleming",
        "questions": 100,
        "answered": 100,
        "stopped": None,
        "alpha": 0.05,
        "margin": 0.05,
        "seed": 0,
    }
    look = sequential_look(df, state)
    assert look.reason == "not_worse" and look.choice == RAG
    assert -0.05 < look.ci_low < 0 < look.ci_high < 0.05


def test_a_look_that_fails_is_an_error_not_nothing_scored(tmp_path):
    cfg = config(tmp_path)
    cfg["sequential"] = {"rounds": 2}

    def broken(df, state):
        raise ValueError("the look broke")

    with pytest.raises(ValueError, match="the look broke"):
        run(cfg, progress=False, until_decided=broken)


def test_a_look_with_nothing_scored_continues(tmp_path, monkeypatch):
    from ragbench.experiment import sequential_run

    real = sequential_run.table

    def failed(records, meta, metrics):  # every record an error: no score to decide on
        return real(records, meta, metrics).assign(error="boom", **{m: None for m in metrics})

    monkeypatch.setattr(sequential_run, "table", failed)

    def never(df, state):
        raise AssertionError("no verdict on a look with nothing scored")

    cfg = config(tmp_path)
    cfg["sequential"] = {"rounds": 2}
    df = run(cfg, progress=False, until_decided=never)
    looks = df.attrs["sequential"]["looks"]
    assert [lk["reason"] for lk in looks] == ["nothing scored"] * 2
