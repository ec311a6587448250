"""`ragbench check` and `assert_run`: requirements on a run's summary (means, interval bounds,
costs) and on the verdict's choice; malformed ones name the valid variants and values."""

from __future__ import annotations

import shutil

import pytest
from test_runner import niah_config
from typer.testing import CliRunner

from ragbench.analysis.gate import (
    GateError,
    assert_run,
    check,
    load_run,
    parse_requirement,
    variant_values,
)
from ragbench.analysis.summary import summary
from ragbench.cli import app
from ragbench.experiment.runner import run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    cfg = niah_config(tmp, strategies=["closed_book", "long_context",
                                       {"name": "rag", "params": {"top_k": [1, 4]}}])  # fmt: skip
    cfg["metrics"] = ["contains"]
    cfg["price_sheet"] = "example-hosted-api"
    df = run(cfg, progress=False)
    return df.attrs["run_dir"]


def test_parse_requirements():
    r = parse_requirement("rag k=4: contains.ci_low >= 60%")
    assert (r.variant, r.value, r.op, r.number) == ("rag k=4", "contains.ci_low", ">=", 0.6)
    r = parse_requirement("pipeline mod:fn: dollars_per_1k<0.5")  # a ':' in the label
    assert (r.variant, r.value, r.op, r.number) == ("pipeline mod:fn", "dollars_per_1k", "<", 0.5)
    for bad in ["rag: contains", "contains >= 0.5", "rag: contains => 0.5", "rag: contains >= x"]:
        with pytest.raises(GateError, match="malformed requirement"):
            parse_requirement(bad)


def test_values_are_the_summary(run_dir):
    df, seed = load_run(run_dir)
    table = summary(df, metric="contains", seed=seed).set_index("label")
    values = variant_values(df, seed=seed)
    for label, row in table.iterrows():
        assert values[label]["contains"] == pytest.approx(row["contains"])
        assert values[label]["contains.ci_low"] == pytest.approx(row["ci_low"])
        assert values[label]["contains.n"] == row["n"]
        assert values[label]["dollars_per_1k"] == pytest.approx(row["dollars"] * 1000)


def test_check_fails_one_line_per_requirement(run_dir):
    df, seed = load_run(run_dir)
    assert check(df, ["long_context: contains >= 0.5", "rag k=4: contains.n >= 4"]) == []
    failed = check(df, ["closed_book: contains >= 0.5", "long_context: dollars_per_1k <= 0",
                        "long_context: contains.ci_low >= 0.99"], seed=seed)  # fmt: skip
    assert len(failed) == 3 and all(line.startswith("FAILED ") for line in failed)
    assert "closed_book: contains is 0" in failed[0] and "95% CI" in failed[0]
    with pytest.raises(GateError, match="names 2 variants"):
        check(df, ["rag: contains >= 0.5"])
    with pytest.raises(GateError, match="unknown variant 'rga k=4'.*valid: .*long_context"):
        check(df, ["rga k=4: contains >= 0.5"])
    with pytest.raises(GateError, match="unknown value 'contain'; did you mean 'contains'"):
        check(df, ["long_context: contain >= 0.5"])


def test_check_command_exit_codes(run_dir):
    ok = ["check", run_dir, "--require", "long_context: contains >= 0.5"]
    result = CliRunner().invoke(app, ok)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, [*ok, "--require", "closed_book: contains >= 0.5",
                                      "--require", "long_context: dollars_per_1k <= 0"])  # fmt: skip
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("FAILED closed_book: contains >= 0.5")
    result = CliRunner().invoke(app, ["check", run_dir, "--require", "rag: contains >> 1"])
    assert result.exit_code == 2 and "malformed requirement 'rag: contains >> 1'" in result.output
    result = CliRunner().invoke(app, ["check", run_dir, "--require", "rag: contains >= 1"])
    assert result.exit_code == 2 and "rag k=1" in result.output  # names the variants
    result = CliRunner().invoke(app, ["check", run_dir, "--verdict", "closed_book"])
    assert (
        result.exit_code == 1 and "FAILED verdict closed_book: the verdict chose" in result.output
    )


def test_assert_run_inside_pytest(run_dir):
    assert_run(run_dir, "long_context: contains.ci_low >= 0.3")
    with pytest.raises(AssertionError, match="FAILED closed_book: contains >= 0.5"):
        assert_run(run_dir, "closed_book: contains >= 0.5", "long_context: contains >= 0.5")
    with pytest.raises(AssertionError, match="FAILED verdict closed_book"):
        assert_run(run_dir, verdict="closed_book")
    import ragbench

    assert ragbench.assert_run is assert_run


def test_a_verdict_naming_no_variant_is_malformed_and_names_them(run_dir):
    df, seed = load_run(run_dir)
    with pytest.raises(GateError, match=r"verdict 'bogus' names no variant.*valid: .*rag k=1"):
        check(df, [], verdict="bogus", seed=seed)
    result = CliRunner().invoke(app, ["check", run_dir, "--verdict", "bogus"])
    assert result.exit_code == 2, result.output
    assert "FAILED" not in result.output and "rag k=1" in result.output


def test_a_configured_metric_without_scores_fails_saying_so(run_dir, tmp_path):
    """A judge that never answered: its column is all NaN. A requirement on it is a FAILED line
    that says so (exit 1), not an 'unknown value' (exit 2)."""
    df, seed = load_run(run_dir)
    df = df.assign(judge_correct=float("nan"))
    failed = check(df, ["rag k=4: judge_correct >= 0.5", "rag k=4: judge_correct.ci_low >= 0.5",
                        "long_context: contains >= 0.5"], seed=seed)  # fmt: skip
    assert len(failed) == 2
    for line in failed:
        assert line.startswith("FAILED rag k=4: judge_correct")
        assert "judge_correct is configured but unscored in this run" in line
    shutil.copytree(run_dir, tmp_path / "run")
    df.to_parquet(tmp_path / "run" / "results.parquet")
    result = CliRunner().invoke(
        app, ["check", str(tmp_path / "run"), "--require", "rag k=4: judge_correct >= 0.5"]
    )
    assert result.exit_code == 1, result.output
    assert "judge_correct is configured but unscored in this run" in result.output


def test_failed_records_and_an_unfinished_run_fail_the_gate(run_dir, tmp_path):
    """The summary's means leave failed records out: 2 of long context's 4 failing is a FAILED
    line (unless allowed), not a mean over the 2 that happened to succeed; a run folder whose
    manifest says it stopped (its budget) or is still running is not a finished run."""
    import json

    df, seed = load_run(run_dir)
    lc = df.index[df["strategy"] == "long_context"][:2]
    broken = df.copy()
    broken.loc[lc, "error"] = "LLMRequestError: the server went away"
    req = ["long_context: contains >= 0.5"]
    assert check(df, req, seed=seed) == []
    [line] = check(broken, req, seed=seed)
    assert line.startswith("FAILED records: 2 failed (long_context") and "2 of 4" in line
    assert "the server went away" in line and "--max-errors 2" in line
    assert check(broken, req, seed=seed, max_errors=2) == []
    assert check(broken, ["rag k=4: contains >= 0"], seed=seed) == []  # not a variant it reads
    assert check(broken, [], verdict="long_context", seed=seed)[0].startswith("FAILED records")

    folder = tmp_path / "run"
    shutil.copytree(run_dir, folder)
    broken.to_parquet(folder / "results.parquet")
    result = CliRunner().invoke(app, ["check", str(folder), "-r", req[0]])
    assert result.exit_code == 1 and "FAILED records: 2 failed" in result.output
    allowed = CliRunner().invoke(app, ["check", str(folder), "-r", req[0], "--max-errors", "2"])
    assert allowed.exit_code == 0, allowed.output

    df.to_parquet(folder / "results.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["status"] = "stopped"
    manifest["sessions"][-1].update(stopped="budget", budget={"records_left": 7})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["check", str(folder), "-r", req[0]])
    assert result.exit_code == 1, result.output
    assert "FAILED run: its manifest says stopped (budget), 7 records left" in result.output
    with pytest.raises(AssertionError, match="its manifest says stopped"):
        assert_run(folder, *req)
    manifest["status"] = "running"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AssertionError, match="its manifest says running"):
        assert_run(folder, *req)
