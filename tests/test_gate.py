"""`ragbench check` and `assert_run`: requirements on a run's summary (means, interval bounds,
costs) and on the verdict's choice; malformed ones name the valid variants and values."""

from __future__ import annotations

import math
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
from ragbench.analysis.labels import with_labels
from ragbench.cli import app
from ragbench.experiment.runner import run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    cfg = niah_config(
        tmp,
        strategies=["closed_book", "long_context", {"name": "rag", "params": {"top_k": [1, 4]}}],
    )
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


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's 95% score interval for ``k`` of ``n``, from its formula."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_values_are_the_run_s_numbers(run_dir):
    """Each value from the records themselves: the mean, Wilson's interval from its formula, the
    count and the mean dollars; and the numbers the fake model must give on these needles."""
    df, seed = load_run(run_dir)
    values = variant_values(df, seed=seed)
    rows = with_labels(df)
    rag = " embedder=hash chunk=64 overlap=8"
    assert set(values) == {"closed_book", "long_context", "rag k=1" + rag, "rag k=4" + rag}
    for label, own in rows.groupby("label"):
        k, n = int(own["contains"].sum()), len(own)
        lo, hi = wilson(k, n)
        assert values[label]["contains"] == pytest.approx(k / n)
        assert values[label]["contains.ci_low"] == pytest.approx(lo)
        assert values[label]["contains.ci_high"] == pytest.approx(hi)
        assert values[label]["contains.n"] == n == 4
        assert values[label]["dollars_per_1k"] == pytest.approx(own["dollars"].mean() * 1000)
    # the fake reads every needle from the documents and none without them
    assert values["long_context"]["contains"] == 1.0 and values["closed_book"]["contains"] == 0.0
    assert values["long_context"]["contains.ci_low"] == pytest.approx(0.5101, abs=1e-4)


def test_check_fails_one_line_per_requirement(run_dir):
    df, seed = load_run(run_dir)
    assert check(df, ["long_context: contains >= 0.5", "rag k=4: contains.n >= 4"]) == []
    failed = check(
        df,
        [
            "closed_book: contains >= 0.5",
            "long_context: dollars_per_1k <= 0",
            "long_context: contains.ci_low >= 0.99",
        ],
        seed=seed,
    )
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
    result = CliRunner().invoke(
        app,
        [
            *ok,
            "--require",
            "closed_book: contains >= 0.5",
            "--require",
            "long_context: dollars_per_1k <= 0",
        ],
    )
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
    failed = check(
        df,
        [
            "rag k=4: judge_correct >= 0.5",
            "rag k=4: judge_correct.ci_low >= 0.5",
            "long_context: contains >= 0.5",
        ],
        seed=seed,
    )
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


def test_a_verdict_for_a_model_too_weak_to_tell_fails_the_gate(run_dir, tmp_path):
    """The verdict's choice is no evidence when the model is too weak for the questions: 10% of
    200 against 0% (every upper bound under 30%) fails ``--verdict rag`` with the verdict's
    line; closed book ahead of every variant that reads the documents fails it too."""
    from test_verdict import PRICES, results

    weak = results({"long_context": [0] * 200, "rag k=3": [1] * 20 + [0] * 180}, PRICES)
    [line] = check(weak, [], verdict="rag")
    assert line.startswith("FAILED verdict rag: Every variant answered at most 10% of the "), line
    assert line.endswith("try a stronger model. (it chose rag k=3)"), line
    strong = results({"long_context": [0] * 100 + [1] * 100, "rag k=3": [1] * 200}, PRICES)
    assert check(strong, [], verdict="rag") == []

    df, _ = load_run(run_dir)  # closed book answers every question, the others none
    closed = df["strategy"] == "closed_book"
    df.loc[closed, "contains"], df.loc[~closed, "contains"] = 1.0, 0.0
    folder = tmp_path / "run"
    shutil.copytree(run_dir, folder)
    df.to_parquet(folder / "results.parquet")
    result = CliRunner().invoke(app, ["check", str(folder), "--verdict", "long_context"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("FAILED verdict long_context: ")
    assert "No variant beats closed book: closed_book scored 100% without the documents" in (
        result.output
    )
