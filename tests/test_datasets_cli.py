"""`ragbench data ...` commands and the dataset registry."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from ragbench.cli.data import register
from ragbench.datasets import DATASETS, build_dataset, dataset_names
from ragbench.datasets.formats import read_examples
from ragbench.io import sha256_file

WS = ["--tokenizer", "whitespace"]


@pytest.fixture()
def app():
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, like the root `ragbench` app
        pass

    register(app)
    return app


@pytest.fixture()
def run(app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0):
        result = runner.invoke(app, ["data", *args])
        assert result.exit_code == code, result.output
        return result.output

    return invoke


def _written(output: str):
    path = re.search(r"wrote \d+ examples to (\S+)", output).group(1)
    fp = re.search(r"fingerprint ([0-9a-f]{64})", output).group(1)
    return path, fp


def test_niah_writes_default_path_with_fingerprint(run, tmp_path):
    args = ["niah", "--context-lengths", "500,900", "--depths", "0,50,100", *WS]
    out = run(*args)
    path, fp = _written(out)
    # named by its parameters; the whitespace tokenizer (not the default) adds a hash suffix
    assert re.fullmatch(r"data/generated/niah-L500\+900-D0\+50\+100-[0-9a-f]{6}\.jsonl", path)
    assert "wrote 6 examples" in out
    assert sha256_file(tmp_path / path) == fp
    first = (tmp_path / path).read_bytes()
    assert _written(run(*args)) == (path, fp)  # same params: same file name, same bytes
    assert (tmp_path / path).read_bytes() == first
    examples = read_examples(tmp_path / path)
    assert [e.id for e in examples][:2] == ["niah-L500-D0", "niah-L500-D50"]
    other, _ = _written(run("niah", "--context-lengths", "500", *WS))
    assert other != path


def test_ruler_command(run, tmp_path):
    out = run(
        "ruler",
        "niah_multikey",
        "--context-lengths",
        "800",
        "--num-examples",
        "3",
        "--haystack",
        "noise",
        "--param",
        "num_keys=3",
        "--out",
        "mk.jsonl",
        *WS,
    )
    path, fp = _written(out)
    assert path == "mk.jsonl" and sha256_file(tmp_path / path) == fp
    examples = read_examples(tmp_path / path)
    assert len(examples) == 3 and all(len(e.meta["distractor_keys"]) == 2 for e in examples)
    out = run("ruler", "niah_singel", code=2)
    assert "did you mean 'niah_single'" in out and "variable_tracking" in out
    out = run("ruler", "niah_single", "--param", "num_kyes=2", *WS, code=2)
    assert "did you mean 'num_keys'" in out
    out = run(
        "ruler", "common_words", "--context-lengths", "600", "--param", "freq_cw=30", *WS, code=2
    )
    assert "lower freq_cw" in out
    assert not list(tmp_path.glob("data/generated/ruler-common_words*"))  # nothing half-written


def test_multidoc_command(run, tmp_path):
    out = run(
        "multidoc", "--num-docs", "5", "--gold-positions", "start,3", "--num-examples", "2", *WS
    )
    path, _ = _written(out)
    examples = read_examples(tmp_path / path)
    assert [e.meta["gold_position"] for e in examples] == [0, 3, 0, 3]
    assert "did you mean 'middle'" in run("multidoc", "--gold-positions", "midle", *WS, code=2)


def test_niah_unfillable_length_fails_cleanly(run, tmp_path):
    (tmp_path / "hay").mkdir()
    (tmp_path / "hay" / "a.txt").write_text("Short text. Only a few words.")
    out = run("niah", "--context-lengths", "1000", "--haystack", "hay", *WS, code=2)
    assert "error: haystack" in out and "tokens" in out
    assert not (tmp_path / "data").exists()


def test_import_squad_and_longbench(run, tmp_path):
    squad = {
        "version": "v2.0",
        "data": [
            {
                "title": "Rivers",
                "paragraphs": [
                    {
                        "context": "The Nile is the longest river in Africa.",
                        "qas": [
                            {
                                "id": "q1",
                                "question": "Which river is the longest in Africa?",
                                "answers": [{"text": "The Nile", "answer_start": 0}],
                                "is_impossible": False,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    path, _ = _written(run("import", "squad", "squad.json"))
    assert path == "data/generated/squad-squad.jsonl"
    [e] = read_examples(tmp_path / path)
    assert e.question.startswith("Which river") and "The Nile" in e.answers
    row = {
        "input": "Who wrote it?",
        "context": "It was written by Ada.",
        "answers": ["Ada"],
        "length": 5,
        "dataset": "hotpotqa",
        "_id": "lb1",
    }
    (tmp_path / "lb.jsonl").write_text(json.dumps(row) + "\n")
    path, _ = _written(run("import", "longbench", "lb.jsonl", "--out", "lb-out.jsonl"))
    [e] = read_examples(tmp_path / path)
    assert e.answers == ("Ada",) and e.documents[0].text == "It was written by Ada."
    (tmp_path / "bad.jsonl").write_text('{"input": "q"}\n')
    out = run("import", "longbench", "bad.jsonl", code=2)
    assert "bad.jsonl:1" in out
    assert "did you mean 'squad'" in run("import", "squadd", "x.json", code=2)


def test_dedup_command(run, tmp_path):
    run("niah", "--context-lengths", "500", "--depths", "50", "--out", "one.jsonl", *WS)
    text = (tmp_path / "one.jsonl").read_text()
    (tmp_path / "twice.jsonl").write_text(text + text.replace("niah-L500-D50", "copy"))
    out = run("dedup", "twice.jsonl")
    assert "n_in: 2" in out and "n_kept: 1" in out
    assert "wrote data/generated/twice.dedup.jsonl" in out
    [kept] = read_examples(tmp_path / "data/generated/twice.dedup.jsonl")
    assert kept.id == "niah-L500-D50"
    assert run("dedup", "missing.jsonl", code=2).startswith("error:")


def test_dedup_drops_repeated_records_and_counts_them(run, tmp_path):
    run("niah", "--context-lengths", "500", "--depths", "50", "--out", "one.jsonl", *WS)
    text = (tmp_path / "one.jsonl").read_text()
    (tmp_path / "thrice.jsonl").write_text(text * 3)  # e.g. a file appended to itself
    out = run("dedup", "thrice.jsonl", "--out", "clean.jsonl")
    assert "repeated_records: 2" in out and "n_in: 3" in out and "n_kept: 1" in out
    assert "kept 1 of 3 records: dropped 2 repeated, 0 exact and 0 near duplicates" in out
    assert [e.id for e in read_examples(tmp_path / "clean.jsonl")] == ["niah-L500-D50"]


def test_dedup_conflicting_ids_is_one_line_naming_both_lines(app, run, tmp_path):
    run("niah", "--context-lengths", "500", "--depths", "25,75", "--out", "two.jsonl", *WS)
    first, second = (tmp_path / "two.jsonl").read_text().splitlines()
    clash = second.replace("niah-L500-D75", "niah-L500-D25")  # same id, other content
    (tmp_path / "clash.jsonl").write_text(f"{first}\n{second}\n{clash}\n")
    result = CliRunner().invoke(app, ["data", "dedup", "clash.jsonl"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    [line] = result.stderr.splitlines()
    assert line.startswith("error: clash.jsonl:3: field 'id': id 'niah-L500-D25' is also on line 1")
    assert "Traceback" not in result.output and result.stdout == ""
    assert not (tmp_path / "data").exists()


def test_dedup_warns_when_near_duplicates_dominate(run, tmp_path, caplog):
    run(
        "niah",
        "--context-lengths",
        "500",
        "--depths",
        "0,25,50,75,100",
        "--out",
        "sweep.jsonl",
        *WS,
    )
    with caplog.at_level("WARNING", logger="ragbench.datasets.corpus.dedup"):
        out = run("dedup", "sweep.jsonl", "--out", "d.jsonl")
    assert "near_duplicates: 4" in out
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "dropped 4 of 5 examples (80%) at MinHash threshold 0.8" in warning
    assert "higher threshold (e.g. 0.9)" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragbench.datasets.corpus.dedup"):
        out = run("dedup", "sweep.jsonl", "--out", "d.jsonl", "--threshold", "0.98")
    assert "near_duplicates: 0" in out and not caplog.records
    # a real process (no pytest log capture): the warning reaches stderr, once
    cmd = [sys.executable, "-m", "ragbench.cli", "data", "dedup", "sweep.jsonl", "--out", "d.jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("dropped 4 of 5 examples (80%) at MinHash threshold 0.8") == 1


def test_registry_builds_and_names_choices(tmp_path):
    names = dataset_names()
    assert {"niah", "multidoc", "file", "ruler/niah_single", "ruler/common_words"} <= set(names)
    examples = build_dataset(
        "ruler/variable_tracking", context_lengths=700, num_examples=2, tokenizer="whitespace"
    )
    assert [e.meta["task"] for e in examples] == ["ruler/variable_tracking"] * 2
    from ragbench.datasets.formats import write_examples

    write_examples(tmp_path / "vt.jsonl", examples)
    assert build_dataset("file", path=tmp_path / "vt.jsonl") == examples
    with pytest.raises(ValueError, match=r"unknown dataset 'ruler/niah'; did you mean"):
        build_dataset("ruler/niah")
    with pytest.raises(ValueError, match="unknown parameter 'context_length'; did you mean"):
        build_dataset("niah", context_length=1000)
    with pytest.raises(ValueError, match="missing a required argument: 'path'"):
        build_dataset("file")
    assert DATASETS.kind == "dataset"


def test_registry_is_lazy():
    code = (
        "import sys, ragbench.datasets as d; d.dataset_names(); "
        "print(sorted(m for m in sys.modules if m.startswith(('ragbench.datasets.', 'numpy', "
        "'transformers', 'torch', 'wonderwords'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_folder_as_out_is_refused_before_anything_is_generated(run, tmp_path):
    (tmp_path / "here").mkdir()
    for args in (
        ["niah", "--context-lengths", "300", "--depths", "50", *WS],
        ["ruler", "vt", "--context-lengths", "600", "--num-examples", "1", *WS],
    ):
        out = run(*args, "--out", "here", code=2)
        assert (
            out.strip() == "error: --out here is a folder: name the file, e.g. here/examples.jsonl"
        )
    assert not list(tmp_path.glob(".here.*"))  # no temporary file left beside it
