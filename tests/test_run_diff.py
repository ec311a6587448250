"""``report.compare_runs`` / ``ragbench diff``: two runs paired question by question.

Two kinds of fixture: run folders written by hand with known per-question correctness (so the
flipped ids, the left-out counts and the 2x2 table are known before the code runs), and two real
fake-backend runs that differ in ``retrieval.chunk_size`` (checked against the two results
tables read with pandas). The paired difference is checked against Tango's interval computed
here by maximising the constrained likelihood numerically (not the closed form ``tango`` uses)
and McNemar's p from its formula. Also: analyses refuse two runs concatenated, and
``ragbench.load`` of two runs counts each run's questions once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import ragbench
from ragbench import analysis, report
from ragbench.analysis._common import DuplicateRowsError
from ragbench.cli import app
from ragbench.report.run_diff import RunDiffError, compare_runs
from ragbench.report.run_match import MatchError, Variant, match_variants, split_pair
from ragbench.report.runs import RunFolderError
from ragbench.schema import SCHEMA_VERSION

FAKE = Path(__file__).parents[1] / "configs" / "fake.yaml"

RAG_A, RAG_B = "rag k=4 chunk=64", "rag k=4 chunk=32"
# per question, right (1) or wrong (0) in each run; q0, q1 only in A, q10, q11 only in B
RAG_SCORES_A = {
    "q0": 0,
    "q1": 0,
    "q2": 1,
    "q3": 1,
    "q4": 1,
    "q5": 1,
    "q6": 0,
    "q7": 0,
    "q8": 1,
    "q9": 1,
}
RAG_SCORES_B = {
    "q2": 1,
    "q3": 0,
    "q4": 1,
    "q5": 1,
    "q6": 1,
    "q7": 1,
    "q8": 0,
    "q9": 0,
    "q10": 1,
    "q11": 1,
}
A_ONLY, B_ONLY = ("q3", "q8", "q9"), ("q6", "q7")  # right in A only / in B only, shared ids
SHARED = [f"q{i}" for i in range(2, 10)]


def _rows(label, strategy, params, scores, dollars, latency):
    return [
        {
            "example_id": q,
            "strategy": strategy,
            "label": label,
            "params": json.dumps(params),
            "prediction": "x",
            "answers": '["x"]',
            "error": None,
            "string_match_all": float(s),
            "dollars": dollars(i),
            "resource_seconds": 0.1 * (i + 1),
            "latency_seconds": latency,
        }
        for i, (q, s) in enumerate(scores.items())
    ]


def _write_run(folder: Path, rows: list[dict], config: dict) -> Path:
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(folder / "results.parquet")
    manifest = {"schema_version": SCHEMA_VERSION, "config": config}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def _config(model: str, chunk: int) -> dict:
    return {
        "name": "t",
        "seed": 0,
        "model": {"backend": "fake", "name": model},
        "retrieval": {"chunk_size": chunk, "chunk_overlap": 8},
        "strategies": [
            {"name": "closed_book", "params": {}},
            {"name": "rag", "params": {"top_k": 4}},
        ],
    }


@pytest.fixture()
def two_runs(tmp_path):
    """Run A (model m1, chunks of 64) and run B (model m2, chunks of 32), by hand. A also ran
    long_context, which B did not."""
    rag_a = {"top_k": 4, "chunk_size": 64, "chunk_overlap": 8}
    rag_b = {"top_k": 4, "chunk_size": 32, "chunk_overlap": 8}
    closed_a = {q: 0 for q in RAG_SCORES_A}
    closed_b = {q: 0 for q in RAG_SCORES_B}
    a_rows = (
        _rows("closed_book", "closed_book", {}, closed_a, lambda i: 0.001, 0.1)
        + _rows(RAG_A, "rag", rag_a, RAG_SCORES_A, lambda i: 0.002 * (i + 1), 1.0)
        + _rows(
            "long_context", "long_context", {}, {q: 1 for q in RAG_SCORES_A}, lambda i: 0.01, 3.0
        )
    )
    b_rows = _rows("closed_book", "closed_book", {}, closed_b, lambda i: 0.001, 0.1) + _rows(
        RAG_B, "rag", rag_b, RAG_SCORES_B, lambda i: 0.001, 0.5
    )
    a = _write_run(tmp_path / "run-a", a_rows, _config("m1", 64))
    b = _write_run(tmp_path / "run-b", b_rows, _config("m2", 32))
    return a, b


def _tango_by_likelihood(b: int, c: int, n: int, level: float) -> tuple[float, float]:
    """Tango's score interval for p_a - p_b (b: pairs right in A only, c: in B only), with the
    nuisance parameter P(A wrong, B right) maximised numerically under each delta."""
    from scipy.optimize import brentq, minimize_scalar
    from scipy.stats import norm

    def z(delta: float) -> float:
        lo, hi = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12

        def nll(q: float) -> float:
            rest = 1 - 2 * q - delta
            return -(b * math.log(q + delta) + c * math.log(q) + (n - b - c) * math.log(rest))

        q = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
        return (b - c - n * delta) / math.sqrt(n * (2 * q + delta * (1 - delta)))

    crit = norm.ppf(1 - level / 2)
    est = (b - c) / n
    low = brentq(lambda d: z(d) - crit, -0.999, est)
    high = brentq(lambda d: z(d) + crit, est, 0.999)
    return low, high


def test_flipped_ids_difference_and_interval_of_hand_written_runs(two_runs):
    d = compare_runs(*two_runs)
    assert (d.a, d.b, d.metric) == ("run-a", "run-b", "string_match_all")
    assert [str(s) for s in d.settings] == [
        "model.name: m1 -> m2",
        "retrieval.chunk_size: 64 -> 32",
    ]
    assert (d.shared, d.left_out_a, d.left_out_b) == (8, 2, 2)
    assert [(p.a_label, p.b_label, p.match.rule) for p in d.pairs] == [
        ("closed_book", "closed_book", "same label"),
        (RAG_A, RAG_B, "nearest"),
    ]
    assert d.pairs[1].match.differs == ("chunk_size: 64 -> 32",)
    assert [(u.side, u.label) for u in d.unmatched] == [("A", "long_context")]
    rag = d.pairs[1]
    assert (rag.a_only, rag.b_only) == (A_ONLY, B_ONLY)
    assert rag.n == 8
    assert rag.a_score == pytest.approx(sum(RAG_SCORES_A[q] for q in SHARED) / 8)
    assert rag.b_score == pytest.approx(sum(RAG_SCORES_B[q] for q in SHARED) / 8)
    assert rag.difference == pytest.approx((3 - 2) / 8)
    # two pairs: Bonferroni x2, each interval at 97.5%; McNemar's p = 2 sf(|b - c| / sqrt(b + c))
    from scipy.stats import norm

    assert rag.test == "tango"
    assert rag.p_value == pytest.approx(min(1.0, 2 * 2 * norm.sf(1 / math.sqrt(5))))
    low, high = _tango_by_likelihood(3, 2, 8, 0.05 / 2)
    assert (rag.ci_low, rag.ci_high) == (
        pytest.approx(low, abs=1e-6),
        pytest.approx(high, abs=1e-6),
    )
    assert d.ci_level == pytest.approx(0.975)
    # cost: dollars in both runs; A's rag cost 0.002 * (position + 1), B's 0.001, on shared ids
    assert d.cost == "dollars"
    dollars_a = [0.002 * (list(RAG_SCORES_A).index(q) + 1) for q in SHARED]
    assert rag.cost_ratio == pytest.approx(sum(dollars_a) / 8 / 0.001)
    assert rag.cost_ratio_low <= rag.cost_ratio <= rag.cost_ratio_high
    assert rag.latency_ratio == pytest.approx(2.0)
    closed = d.pairs[0]
    assert (closed.a_only, closed.b_only, closed.difference, closed.p_value) == ((), (), 0.0, 1.0)


def test_the_table_json_and_text_say_the_same(two_runs):
    d = compare_runs(*two_runs)
    table = d.table()
    assert list(table["n_a_only"]) == [0, 3] and list(table["n_b_only"]) == [0, 2]
    out = d.to_json()
    assert {"settings", "left_out", "pairs"} <= set(out)
    assert out["left_out"] == {"a": 2, "b": 2}
    assert out["pairs"][1]["a_only"] == list(A_ONLY) and out["pairs"][1]["b_only"] == list(B_ONLY)
    json.dumps(out, allow_nan=False)  # plain JSON: no NaN
    text = d.text(limit=2)
    lines = text.splitlines()
    assert lines[0] == "A = run-a, B = run-b"
    assert lines[1:4] == [
        "settings that differ (A -> B):",
        "  model.name: m1 -> m2",
        "  retrieval.chunk_size: 64 -> 32",
    ]
    assert "left out: 2 asked only by A, 2 only by B" in text
    assert "right in A only: 3: q3, q8 and 1 more" in text
    assert "right in B only: 2: q6, q7" in text
    assert "unmatched in A: long_context" in text


def test_given_pairs_override_and_unknown_labels_name_the_valid_ones(two_runs):
    d = compare_runs(*two_runs, pairs={"long_context": RAG_B})
    rules = {(p.a_label, p.b_label): p.match.rule for p in d.pairs}
    assert rules == {("closed_book", "closed_book"): "same label", ("long_context", RAG_B): "given"}
    assert {u.label for u in d.unmatched} == {RAG_A}
    given = next(p for p in d.pairs if p.match.rule == "given")
    # long_context right on every shared question, B's rag wrong on q3, q8, q9
    assert given.a_only == A_ONLY and given.b_only == ()
    # the CLI's text form: labels hold '=', the cut is the one between a label of each run
    same = compare_runs(*two_runs, pairs=[f"long_context={RAG_B}"])
    assert [p.match for p in same.pairs] == [p.match for p in d.pairs]
    with pytest.raises(KeyError, match="did you mean 'long_context'"):
        compare_runs(*two_runs, pairs={"long_contxt": RAG_B})
    with pytest.raises(ValueError, match=f"valid: closed_book, {RAG_B}"):
        compare_runs(*two_runs, pairs=[f"long_context={RAG_B}x"])


def test_no_shared_question_and_bad_paths_are_one_line_errors(two_runs, tmp_path):
    a, _ = two_runs
    other = _write_run(
        tmp_path / "other",
        _rows("closed_book", "closed_book", {}, {"z1": 0}, lambda i: 0.001, 0.1),
        _config("m1", 64),
    )
    with pytest.raises(RunDiffError, match="no question in common"):
        compare_runs(a, other)
    with pytest.raises(RunFolderError):
        compare_runs(a, tmp_path / "missing")
    runner = CliRunner()
    for args, needle in [
        ([a, other], "no question in common: run-a asked 10 questions"),
        ([a, tmp_path / "missing"], "no such run folder"),
        ([a, two_runs[1], "--pair", "long_contxt=closed_book"], "did you mean 'long_context'"),
    ]:
        result = runner.invoke(app, ["diff", *map(str, args)])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_cli_json_and_text(two_runs):
    runner = CliRunner()
    result = runner.invoke(app, ["diff", *map(str, two_runs), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"settings", "left_out", "pairs"} <= set(out)
    assert out["settings"][1] == {"key": "retrieval.chunk_size", "a": 64, "b": 32}
    keys = {
        "a_label",
        "b_label",
        "n",
        "a_score",
        "b_score",
        "difference",
        "ci_low",
        "ci_high",
        "p_value",
        "cost_ratio",
        "a_only",
        "b_only",
    }
    assert all(keys <= set(p) for p in out["pairs"])
    assert out["pairs"][1]["a_only"] == list(A_ONLY)
    text = runner.invoke(app, ["diff", *map(str, two_runs)])
    assert text.exit_code == 0 and text.stdout.index("settings that differ") < text.stdout.index(
        "matching"
    )


def test_resource_seconds_when_one_run_has_no_dollars(two_runs, tmp_path):
    a, b = two_runs
    table = pd.read_parquet(b / "results.parquet").drop(columns="dollars")
    table.to_parquet(b / "results.parquet")
    d = compare_runs(a, b)
    assert d.cost == "resource_seconds"
    rag = d.pairs[1]
    seconds_a = [0.1 * (list(RAG_SCORES_A).index(q) + 1) for q in SHARED]
    seconds_b = [0.1 * (list(RAG_SCORES_B).index(q) + 1) for q in SHARED]
    assert rag.cost_ratio == pytest.approx(sum(seconds_a) / sum(seconds_b))


# ------------------------------------------------------------------------------ the matching


def _v(label: str, strategy: str = "rag", **params) -> Variant:
    return Variant(label, strategy, params)


def test_nearest_matches_within_what_differs_between_the_runs():
    a = [
        _v("k1 c64", top_k=1, chunk_size=64),
        _v("k4 c64", top_k=4, chunk_size=64),
        _v("lc", "long_context"),
    ]
    b = [_v("k1 c32", top_k=1, chunk_size=32), _v("lc2", "long_context", overflow="x")]
    matches, unmatched = match_variants(a, b, {})
    # top_k differs between the runs ({1, 4} against {1}), and B's k=1 is one parameter from
    # A's k=1, two from A's k=4; long_context's overflow differs too: its pair is the only one
    assert [(m.a_label, m.b_label, m.rule) for m in matches] == [
        ("k1 c64", "k1 c32", "nearest"),
        ("lc", "lc2", "nearest"),
    ]
    assert [(u.side, u.label) for u in unmatched] == [("A", "k4 c64")]
    # both runs with k=1 and k=4: top_k is shared, so k never pairs across
    b2 = [_v("k4 c32", top_k=4, chunk_size=32)]
    matches, unmatched = match_variants(a[:2], b2, {})
    assert [(m.a_label, m.b_label) for m in matches] == [("k4 c64", "k4 c32")]


def test_ambiguous_and_cross_strategy_variants_stay_unmatched():
    a = [_v("c64", chunk_size=64), _v("c128", chunk_size=128)]
    b = [_v("c32", chunk_size=32), _v("cb", "closed_book")]
    matches, unmatched = match_variants(a, b, {})
    assert matches == []
    why = {u.label: u.why for u in unmatched}
    assert why["c32"] == "as near to 2 variants of A: c64; c128"
    assert why["cb"].startswith("no variant of its strategy left unpaired in A")
    matches, _ = match_variants(a, b, {"c128": "c32"})
    assert [(m.a_label, m.b_label, m.rule, m.differs) for m in matches] == [
        ("c128", "c32", "given", ("chunk_size: 128 -> 32",))
    ]


def test_split_pair_cuts_at_the_equals_between_two_labels():
    a, b = ["rag k=1 chunk=64", "long_context"], ["rag k=1 chunk=32", "long_context"]
    assert split_pair("rag k=1 chunk=64=rag k=1 chunk=32", a, b) == (a[0], b[0])
    assert split_pair("long_context = rag k=1 chunk=32", a, b) == ("long_context", b[0])
    with pytest.raises(MatchError, match="expected LABEL_A=LABEL_B"):
        split_pair("long_context", a, b)
    with pytest.raises(MatchError, match="unknown label of run A .* 'rag k=2'"):
        split_pair("rag k=2=long_context", a, b)
    with pytest.raises(MatchError, match="no label of run A"):
        split_pair("rag k=2=lc", a, b)


# ------------------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory):
    """Two fake-backend runs of configs/fake.yaml, chunks of 64 and of 32 tokens."""
    import yaml

    out = tmp_path_factory.mktemp("runs")
    folders = []
    for chunk in (64, 32):
        cfg = yaml.safe_load(FAKE.read_text(encoding="utf-8"))
        cfg["output_dir"] = str(out)
        cfg["retrieval"]["chunk_size"] = chunk
        before = set(out.iterdir())
        ragbench.run(cfg, progress=False)
        folders.append(next(iter(set(out.iterdir()) - before)))
    return folders


def test_fake_runs_differing_in_chunk_size(fake_runs):
    a, b = fake_runs
    d = compare_runs(a, b)
    assert [str(s) for s in d.settings] == ["retrieval.chunk_size: 64 -> 32"]
    assert (d.shared, d.left_out_a, d.left_out_b, d.unmatched) == (6, 0, 0, ())
    ta, tb = pd.read_parquet(a / "results.parquet"), pd.read_parquet(b / "results.parquet")
    labels_a, labels_b = list(dict.fromkeys(ta["label"])), list(dict.fromkeys(tb["label"]))
    assert [(p.a_label, p.b_label) for p in d.pairs] == list(zip(labels_a, labels_b, strict=True))
    for p in d.pairs:
        same = p.a_label == p.b_label
        assert p.match.rule == ("same label" if same else "nearest")
        assert p.match.differs == (() if same else ("chunk_size: 64 -> 32",))
        if not same:
            assert "chunk=64" in p.a_label and p.b_label == p.a_label.replace(
                "chunk=64", "chunk=32"
            )
        x = ta[ta["label"] == p.a_label].set_index("example_id")["string_match_all"]
        y = (
            tb[tb["label"] == p.b_label]
            .set_index("example_id")["string_match_all"]
            .reindex(x.index)
        )
        assert p.a_only == tuple(x.index[(x == 1) & (y == 0)])
        assert p.b_only == tuple(x.index[(x == 0) & (y == 1)])
        assert p.difference == pytest.approx(x.mean() - y.mean())
        cost_a = ta[ta["label"] == p.a_label]["dollars"].mean()
        cost_b = tb[tb["label"] == p.b_label]["dollars"].mean()
        assert p.cost_ratio == pytest.approx(cost_a / cost_b)
    # what ragbench.load returns for one run is accepted too, with the same result
    same = compare_runs(ragbench.load(a), ragbench.load(b))
    assert same.pairs == d.pairs and same.settings == d.settings
    with pytest.raises(RunDiffError, match="holds 2 runs"):
        compare_runs(ragbench.load([a, b]), b)


def test_analyses_refuse_two_runs_concatenated_and_load_counts_each_once(fake_runs):
    a, b = fake_runs
    both = pd.concat([ragbench.load(a), ragbench.load(b)], ignore_index=True)
    fix = r"two runs concatenated\? load them with ragbench.load\(\[run_a, run_b\]\)"
    for analyse in (
        analysis.summary,
        analysis.verdict,
        analysis.compare,
        analysis.oracle_router,
        analysis.attribute,
        report.router_headroom,
    ):
        with pytest.raises(DuplicateRowsError, match=fix):
            analyse(both)
    # closed_book and long_context keep their labels across chunk sizes: 2 x 6 questions twice
    with pytest.raises(DuplicateRowsError, match=r"^12 duplicated \(example_id, label\) rows"):
        analysis.summary(both)
    loaded = ragbench.load([a, b])
    table = analysis.summary(loaded)
    assert len(table) == 10 and set(table["n"]) == {6}
    assert all(label.startswith((f"{a.name}: ", f"{b.name}: ")) for label in table["label"])
    assert analysis.verdict(loaded).n_pairs == 6
