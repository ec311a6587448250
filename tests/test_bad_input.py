"""Bad input through the CLI: each case exits with its code and ONE ``error: ...`` line naming the
file and the line or key, never a traceback (``ragbench.io.user_errors``)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import yaml
from openai_server import raw, serving
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.datasets.formats import write_examples
from ragbench.experiment.resources import load_examples
from ragbench.types import Document, Example
from ragbench.workspace.notebook import model_block
from ragbench.workspace.sweep.spec import SweepSpecError, load_spec

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "configs" / "fake.yaml"
QUICKSTART = ROOT / "notebooks" / "00_quickstart.ipynb"

serve = pytest.fixture(serving, name="serve")


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result, code: int, *needles: str) -> str:
    """The single ``error:`` line of a failed command, checked for ``needles``."""
    assert result.exit_code == code, result.output
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    ), result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def fake_config(tmp_path: Path, name: str = "cfg.yaml", **changes) -> Path:
    """configs/fake.yaml with ``changes`` (dotted keys) and fewer strategies, in ``tmp_path``."""
    data = yaml.safe_load(FAKE.read_text())
    data["strategies"] = ["long_context"]
    data["output_dir"] = str(tmp_path / "runs")
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small_dataset(path: Path) -> Path:
    doc = Document("d1", "The special magic number is 7463343. " + "Filler text here. " * 20)
    q = "What is the special magic number?"
    write_examples(path, [Example("q1", q, ("7463343",), (doc,))])
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# ---------------------------------------------------------------------------- files


def test_invalid_utf8_in_a_dataset_names_file_line_and_column(tmp_path):
    data = small_dataset(tmp_path / "data.jsonl")
    good = data.read_bytes()
    data.write_bytes(good + good.replace(b'"q1"', b'"q2"').replace(b"Filler", b"Caf\xe9"))
    cfg = fake_config(tmp_path, dataset={"name": "file", "params": {"path": "data.jsonl"}})
    result = cli("run", cfg, "--quiet")
    line = one_error_line(result, 2, f"{data}:2: not valid UTF-8 (byte 0xe9 at column ")
    assert "save the file as UTF-8" in line
    # the index builder reads the same files the same way
    result = cli("index", "build", data, "--out", tmp_path / "idx", "--embedder", "hash")
    one_error_line(result, 2, f"{data}:2: not valid UTF-8 (byte 0xe9")


def test_a_corrupt_index_sidecar_names_the_file_and_line(tmp_path):
    data = small_dataset(tmp_path / "data.jsonl")
    idx = tmp_path / "idx"
    built = cli(
        "index", "build", data, "--out", idx, "--embedder", "hash", "--tokenizer", "whitespace"
    )
    assert built.exit_code == 0, built.output
    sidecar = idx / "index.json"
    text = sidecar.read_bytes()
    sidecar.write_bytes(text.replace(b'"factory"', b'"f\xe9ctory"'))
    bad_line = text[: text.index(b'"factory"')].count(b"\n") + 1
    result = cli("retrieve", idx, "magic number")
    one_error_line(result, 2, f"{sidecar}:{bad_line}: not valid UTF-8 (byte 0xe9 at column ")
    sidecar.write_text('{"dim": 3,\n  "factory": }')
    result = cli("retrieve", idx, "magic number")
    one_error_line(result, 2, f"{sidecar}:2: invalid JSON (Expecting value at column 14)")


# ---------------------------------------------------------------------------- dataset params


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "context_lengths",
            "abc",
            "dataset.params.context_lengths: expected an integer or a list of integers, each >= "
            '201 (more than final_context_length_buffer, 200); got "abc"',
        ),
        (
            "depth_percents",
            [150],
            "dataset.params.depth_percents: 150 is out of range; valid: numbers within [0, 100]",
        ),
        (
            "context_lengths",
            [-5],
            "dataset.params.context_lengths: -5 is out of range; valid: integers >= 201",
        ),
    ],
)
def test_a_bad_generator_parameter_names_its_key_and_range(tmp_path, key, value, message):
    cfg = fake_config(tmp_path, **{f"dataset.params.{key}": value})
    one_error_line(cli("run", cfg, "--quiet"), 2, message)
    one_error_line(cli("run", cfg, "--dry-run"), 2, message)
    # given the file, the examples loader names it and the key's line
    with pytest.raises(ValueError) as err:
        load_examples(cfg)
    assert str(err.value).startswith(f"{cfg}:{line_of(cfg, key + ':')}: {message}")


def test_ragbench_run_names_the_config_file_and_line_of_a_bad_generator_parameter(tmp_path):
    cfg = fake_config(tmp_path, **{"dataset.params.depth_percents": [150]})
    one_error_line(
        cli("run", cfg, "--quiet"),
        2,
        f"error: {cfg}:{line_of(cfg, 'depth_percents:')}: dataset.params.depth_percents: 150",
    )


def test_generator_parameters_are_checked_with_their_valid_ranges():
    from ragbench.datasets import build_dataset
    from ragbench.datasets._validate import DatasetParamError

    cases = [
        ("niah", {"context_lengths": [500], "depth_intervals": 0}, "'depth_intervals': 0 is out"),
        ("niah", {"depth_spacing": "log"}, "'depth_spacing': \"log\" is not valid; valid: "),
        (
            "niah",
            {"context_lengths": [203], "tokenizer": "whitespace"},
            "'context_lengths': 203 leaves no room for the",
        ),
        ("ruler/niah_single", {"num_examples": 0}, "'num_examples': 0 is out of range"),
        ("ruler/niah_single", {"value_type": "ints"}, "'value_type': \"ints\" is not valid"),
        ("ruler/common_words", {"context_lengths": "4k"}, "'context_lengths': expected"),
        ("multidoc", {"num_docs": 0}, "'num_docs': 0 is out of range; valid: an integer >= 1"),
        ("multidoc", {"num_docs": 3, "gold_position": [5]}, "'gold_position': gold position 5"),
    ]
    for name, params, message in cases:
        with pytest.raises(DatasetParamError, match=message.replace("(", r"\(")) as err:
            build_dataset(name, **params)
        assert err.value.key in message


# ---------------------------------------------------------------------------- the server


def test_an_unreadable_server_answer_fails_each_record_naming_url_and_request(tmp_path, serve):
    srv = serve(raw('{"choices": [<html>bad gateway</html>'))
    data = small_dataset(tmp_path / "data.jsonl")
    cfg = fake_config(
        tmp_path,
        dataset={"name": "file", "params": {"path": str(data)}},
        model={
            "backend": "openai",
            "name": "m",
            "cache": False,
            "params": {"base_url": srv.url, "max_retries": 0},
        },
        price_sheet=None,
    )
    result = cli("run", cfg, "--quiet")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "all 1 records failed" in result.stderr
    # the request's id, a UUID (servers that validate X-Request-ID want one)
    sent = rf"POST {re.escape(srv.url)}/chat/completions \(request [0-9a-f-]{{36}}\)"
    assert re.search(sent, result.stderr), result.stderr
    assert (
        ") failed after 1 attempt(s): response is not valid JSON (Expecting value: line 1 "
        "column 14): '{\"choices\": [<html>bad gateway</html>'" in result.stderr
    )


# ---------------------------------------------------------------------------- sweeps


def test_a_sweep_spec_setting_the_output_parameter_is_refused_at_its_line(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        f"notebook: {QUICKSTART}\n"
        "parameters:\n  backend: fake\n  output_dir: /tmp/elsewhere\n"
        "grid:\n  top_k: [1, 3]\n"
    )
    with pytest.raises(SweepSpecError) as err:
        load_spec(spec)
    assert str(err.value).startswith(f"{spec}:4: parameters.output_dir: the sweep sets ")
    assert "top-level output_dir key" in str(err.value) and "\n" not in str(err.value)
    spec.write_text(f"notebook: {QUICKSTART}\ngrid:\n  output_dir: [a, b]\n")
    with pytest.raises(SweepSpecError, match=r"sweep.yaml:3: grid.output_dir: the sweep sets"):
        load_spec(spec)
    # another output_param frees output_dir, and refuses its own name instead
    spec.write_text(f"notebook: {QUICKSTART}\noutput_param: out\nparameters: {{out: x}}\n")
    with pytest.raises(SweepSpecError, match=r"sweep.yaml:3: parameters.out: the sweep sets"):
        load_spec(spec)


def test_ragbench_sweep_reports_the_output_parameter_as_one_error_line(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"notebook: {QUICKSTART}\nparameters:\n  output_dir: /tmp/x\n")
    one_error_line(cli("sweep", spec), 2, f"{spec}:3: parameters.output_dir: ")


# ---------------------------------------------------------------------------- backends


def test_a_parameter_the_backend_does_not_take_is_refused_naming_the_valid_ones(tmp_path):
    cfg = fake_config(tmp_path, **{"model.params": {"base_url": "http://127.0.0.1:9/v1"}})
    for extra in ([], ["--dry-run"]):
        one_error_line(
            cli("run", cfg, "--quiet", *extra),
            2,
            "LLM backend 'fake' takes no parameter 'base_url'",
            "valid: answer_fn, context_window",
        )


def test_the_notebooks_model_block_drops_a_base_url_the_backend_cannot_use():
    with pytest.warns(
        UserWarning, match=r"base_url='http://\*\*\*@h:8000/v1' is ignored: the 'fake'"
    ):
        section, counter = model_block("fake", "fake", "http://u:pw@h:8000/v1")
    assert "base_url" not in section["params"] and counter == "whitespace"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        server, _ = model_block("openai", "served", "http://h:8000/v1")
    assert server["params"] == {"base_url": "http://h:8000/v1"}


# ---------------------------------------------------------------------------- exit codes


def test_help_documents_the_exit_codes():
    text = " ".join(cli("--help").output.split())
    assert "Exit codes:" in text and "1: a run in which every record failed" in text
    assert "2: bad input, reported as one `error: ...` line" in text and "preflight" in text


def test_run_help_documents_the_exit_codes():
    text = " ".join(cli("run", "--help").output.split())
    assert "Exit codes:" in text and "1: a run in which every record failed" in text


def test_an_empty_metrics_list_is_refused_when_a_strategy_answers(tmp_path):
    from ragbench.experiment.config.run import load_config
    from ragbench.experiment.config.text import ConfigError

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "name: t\ndataset: {name: niah, params: {context_lengths: [400], tokenizer: whitespace}}\n"
        "model: {backend: fake, name: fake}\nstrategies: [long_context]\nmetrics: []\n"
    )
    with pytest.raises(ConfigError, match=r"cfg.yaml:5: metrics: \[\] scores no answer"):
        load_config(cfg)


@pytest.mark.parametrize("kind", ["squad", "questions", "qrels"])
def test_bytes_that_are_not_utf8_name_their_file_and_line_in_every_importer(tmp_path, kind):
    from ragbench.datasets import beir, importers, questions
    from ragbench.io import InputFileError

    bad = b'{"data": []}\n\xe9\n'
    path = tmp_path / {"squad": "s.json", "questions": "q.csv", "qrels": "test.tsv"}[kind]
    path.write_bytes(bad if kind == "squad" else b"question,answer\nok,1\n\xe9,2\n")
    read = {
        "squad": lambda: importers.load_squad(path),
        "questions": lambda: questions.read_questions(path),
        "qrels": lambda: list(beir._qrels_rows(path)),
    }[kind]
    with pytest.raises(InputFileError, match=rf"{path.name}:\d+: not valid UTF-8"):
        read()


# ---------------------------------------------------------------------------- YAML


def billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_nested_aliases_are_refused_at_once_naming_file_and_line(tmp_path):
    import time

    cfg = tmp_path / "laughs.yaml"
    cfg.write_text(FAKE.read_text() + billion_laughs())
    start = time.monotonic()
    one_error_line(cli("run", cfg), 2, f"{cfg}:", "aliases expand to more than 100,000 values")
    assert time.monotonic() - start < 10  # was 135 s of CPU walking 387M expanded values
    assert not (tmp_path / "runs").exists()
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"notebook: {QUICKSTART}\n" + billion_laughs())
    one_error_line(cli("sweep", spec), 2, f"{spec}:", "aliases expand to more than")


def test_a_few_aliases_and_merge_keys_still_load():
    from ragbench.io import load_yaml

    data = load_yaml("base: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\nks: &k [1, 2]\nd: *k\n")
    assert data == {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}, "ks": [1, 2], "d": [1, 2]}
    assert load_yaml("") is None


def test_a_self_referencing_alias_is_refused():
    from ragbench.io import load_yaml, yaml_problem

    with pytest.raises(yaml.YAMLError) as err:
        load_yaml("a: 1\nb: &x [1, *x]\n")
    assert yaml_problem(err.value) == (2, "an alias refers to a node that contains it")


def test_a_repeated_key_names_file_line_and_key(tmp_path):
    cfg = fake_config(tmp_path)
    text = cfg.read_text()
    cfg.write_text(text + "seed: 3\n")
    line = len(text.splitlines()) + 1
    first = line_of(cfg, "seed: 0")
    one_error_line(
        cli("run", cfg), 2, f"{cfg}:{line}: ", f"duplicate key 'seed' (first at line {first})"
    )
    nested = fake_config(tmp_path, "nested.yaml")
    nested.write_text(
        nested.read_text().replace("  backend: fake\n", "  backend: fake\n  backend: openai\n")
    )
    one_error_line(
        cli("run", nested), 2, f"{nested}:{line_of(nested, 'backend: openai')}: ", "'backend'"
    )
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"notebook: {QUICKSTART}\ngrid:\n  top_k: [1]\n  top_k: [2]\n")
    one_error_line(cli("sweep", spec), 2, f"{spec}:4: ", "duplicate key 'top_k'")


def test_a_config_that_is_not_utf8_names_file_line_and_byte(tmp_path):
    cfg = fake_config(tmp_path)
    line = line_of(cfg, "name: fake")
    cfg.write_bytes(cfg.read_bytes().replace(b"name: fake\n", b"name: fa\xffke\n", 1))
    one_error_line(cli("run", cfg), 2, f"{cfg}:{line}: not valid UTF-8 (byte 0xff at column 9)")
    spec = tmp_path / "sweep.yaml"
    spec.write_bytes(f"notebook: {QUICKSTART}\n".encode() + b"grid: {x: [\xff]}\n")
    one_error_line(cli("sweep", spec), 2, f"{spec}:2: not valid UTF-8")


def test_bad_yaml_in_set_and_in_a_sweep_spec_is_one_line(tmp_path):
    cfg = fake_config(tmp_path)
    line = one_error_line(cli("run", cfg, "--set", "model.max_new_tokens=[1, 2"), 2)
    assert "--set model.max_new_tokens=[1, 2: invalid YAML value: expected ',' or ']'" in line
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"notebook: {QUICKSTART}\ngrid:\n  top_k: [1, 2\n")
    one_error_line(cli("sweep", spec), 2, f"{spec}:", "invalid YAML: ")


# ---------------------------------------------------------------------------- run folders


def free_port() -> int:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pipeline_config(tmp_path: Path, params: dict) -> Path:
    module = tmp_path / "refusedpipe.py"
    module.write_text("notcallable = 3\n")
    return fake_config(tmp_path, strategies=[{"name": "pipeline", "params": params}])


@pytest.mark.parametrize(
    "params, needle",
    [
        (
            {"target": "refusedpipe:notcallable"},
            "pipeline target 'refusedpipe:notcallable' is int 3",
        ),
        ({"url": "http://127.0.0.1:{port}/answer"}, "pipeline endpoint check failed"),
        (
            {"url": "http://127.0.0.1:{port}/a", "headers_env": {"X-Token": "RAGBENCH_UNSET_X"}},
            "which is not set",
        ),
    ],
    ids=["not-callable", "unreachable", "unset-env"],
)
def test_a_refused_run_leaves_no_run_folder(tmp_path, monkeypatch, params, needle):
    monkeypatch.delenv("RAGBENCH_UNSET_X", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "refusedpipe", raising=False)
    port = free_port()
    params = {k: v.format(port=port) if isinstance(v, str) else v for k, v in params.items()}
    cfg = pipeline_config(tmp_path, params)
    result = cli("run", cfg, "--quiet")
    assert result.exit_code == 2 and needle in result.output, result.output
    assert not (tmp_path / "runs").exists()  # neither the run folder nor the output_dir


def test_a_model_refused_at_load_leaves_no_run_folder_but_keeps_earlier_ones(tmp_path, monkeypatch):
    from ragbench.experiment import runner
    from ragbench.experiment.config.run import load_config

    def refuse(spec):
        raise ValueError(f"{spec.name}: pickle-based .bin weights; valid: safetensors")

    monkeypatch.setattr(runner, "load_model", refuse)
    cfg = fake_config(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "an-earlier-run").mkdir()
    one_error_line(cli("run", cfg, "--quiet"), 2, ".bin weights")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["an-earlier-run"]
    # a folder that held something before is never removed, even when the run writes nothing
    out = runner.run_dir_for(load_config(cfg))
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    one_error_line(cli("run", cfg, "--quiet"), 2, ".bin weights")
    assert sorted(p.name for p in out.iterdir()) == [".lock", "notes.txt"]


def test_a_waiter_takes_over_a_folder_its_holder_discarded(tmp_path):
    import subprocess
    import sys
    import time

    from ragbench.locks import FolderLock

    folder = tmp_path / "run"
    waiter = (
        "import sys, time; from ragbench.locks import FolderLock\n"
        f"with FolderLock({str(folder)!r}, wait=True) as lock:\n"
        "    print('held', lock._holds_the_file(), flush=True); time.sleep(0.5)\n"
    )
    with FolderLock(folder) as lock:
        proc = subprocess.Popen(
            [sys.executable, "-c", waiter],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)  # the waiter blocks on the lock
        assert lock.discard_if_empty() and not folder.exists()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip() == "held True"
    # a second writer cannot take the folder while the waiter holds it
    assert not (folder / ".lock.owner").exists()  # the waiter has finished and cleaned up
    assert (folder / ".lock").exists()


# ---------------------------------------------------------------------------- values in range


@pytest.mark.parametrize(
    "changes, needle",
    [
        (
            {"model.max_new_tokens": 1e15},
            "model.max_new_tokens: Input should be less than or equal",
        ),
        (
            {"model.max_new_tokens": 100_000},
            "model.max_new_tokens: 100000 answer tokens leave no room for a prompt in the "
            "8,192-token context window; valid: 1..8191",
        ),
        (
            {"model.params": {"context_window": 512}, "model.max_new_tokens": 512},
            "model.max_new_tokens: 512 answer tokens leave no room",
        ),
        (
            {"model.params": {"context_window": -1}},
            "model.params.context_window: Input should be greater than or equal to 1 (given: -1)",
        ),
        (
            {"strategies": [{"name": "rag", "params": {"top_k": []}}]},
            "strategies.0: top_k: [] gives no parameter point; valid: a value or a non-empty list",
        ),
        (
            {
                "model": {
                    "backend": "openai",
                    "name": "m",
                    "params": {
                        "base_url": "http://h:8000/v1",
                        "headers": {"Authorization": ["Bearer", "s3cret-tok"]},
                    },
                }
            },
            "model.params: headers must map header names to string values; header "
            "'Authorization' is a list",
        ),
        (
            {
                "model": {
                    "backend": "openai",
                    "name": "m",
                    "params": {"base_url": "http://127.0.0.1:notaport/v1"},
                }
            },
            "model.params: base_url must look like http://host:port/v1 with a port in 0..65535",
        ),
    ],
    ids=[
        "huge",
        "over-window",
        "at-given-window",
        "negative-window",
        "empty-grid",
        "headers",
        "port",
    ],
)
def test_values_out_of_range_are_refused_at_validation_naming_the_key(tmp_path, changes, needle):
    cfg = fake_config(tmp_path, **changes)
    for extra in ([], ["--dry-run"]):
        line = one_error_line(cli("run", cfg, "--quiet", *extra), 2, f"{cfg}:", needle)
        assert "s3cret" not in line
    assert not (tmp_path / "runs").exists()


def test_a_context_length_longer_than_the_haystack_names_the_key(tmp_path):
    cfg = fake_config(tmp_path, **{"dataset.params.context_lengths": [10**12]})
    one_error_line(
        cli("run", cfg, "--quiet"),
        2,
        f"{cfg}:{line_of(cfg, 'context_lengths')}: dataset.params.context_lengths: haystack "
        "'essays' has only",
    )


def test_an_example_with_an_empty_question_is_refused_at_its_line(tmp_path):
    data = small_dataset(tmp_path / "data.jsonl")
    good = data.read_text()
    data.write_text(
        good
        + good.replace('"q1"', '"q2"').replace(
            '"question":"What is the special magic number?"', '"question":"  "'
        )
    )
    cfg = fake_config(tmp_path, dataset={"name": "file", "params": {"path": str(data)}})
    one_error_line(cli("run", cfg, "--quiet"), 2, f"{data}:2: field 'question': empty question")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("fmt", ["longbench", "squad"])
def test_a_file_format_named_as_a_dataset_says_how_its_files_run(tmp_path, fmt):
    """Was: ``unknown dataset 'longbench'; did you mean 'longbench-v2'?`` (another metric)."""
    cfg = fake_config(tmp_path, dataset={"name": fmt, "params": {"path": "lb.jsonl"}})
    one_error_line(
        cli("run", cfg, "--quiet"),
        2,
        f"{cfg}:{line_of(cfg, 'dataset:')}: dataset: unknown dataset {fmt!r}: {fmt} is a "
        f"file format, not a dataset; run what `ragbench data import {fmt}` wrote as the dataset "
        "it printed ({name: file, params: {path: OUT.jsonl}}), or the original file as "
        f"{{name: file, params: {{path: FILE, format: {fmt}}}}}",
    )
    assert not (tmp_path / "runs").exists()


def test_answers_as_a_string_are_refused_in_files_and_from_code(tmp_path):
    """The choice: refused wherever ragbench's own example format is read (a file, a dataset
    builder in code); question files and Hugging Face mappings read a string as one answer,
    as their docs say."""
    from ragbench.experiment.resources import DatasetError, check_examples

    data = small_dataset(tmp_path / "data.jsonl")
    data.write_text(data.read_text().replace('"answers":["7463343"]', '"answers":"7463343"'))
    cfg = fake_config(tmp_path, dataset={"name": "file", "params": {"path": str(data)}})
    one_error_line(
        cli("run", cfg, "--quiet"), 2, f"{data}:1: field 'answers': expected a list of strings"
    )
    example = Example("q1", "What?", "7463343", ())  # type: ignore[arg-type]
    with pytest.raises(DatasetError, match=r"example 'q1': answers is a string; valid: a list"):
        check_examples([example], "mine")
    with pytest.raises(DatasetError, match=r"example 'q1' has an empty question"):
        check_examples([Example("q1", " ", ("7",), ())], "mine")


def test_an_html_page_answering_a_stream_names_its_type_and_status(tmp_path, serve):
    srv = serve(raw("<html><body>Please log in</body></html>", content_type="text/html"))
    data = small_dataset(tmp_path / "data.jsonl")
    cfg = fake_config(
        tmp_path,
        dataset={"name": "file", "params": {"path": str(data)}},
        model={
            "backend": "openai",
            "name": "m",
            "cache": False,
            "params": {"base_url": srv.url, "max_retries": 2},
        },
        price_sheet=None,
    )
    result = cli("run", cfg, "--quiet")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "cut short" not in result.stderr
    assert (
        "failed after 1 attempt(s): a text/html answer (HTTP 200), not an event stream or JSON: "
        in (result.stderr)
    )  # not retried: it would answer the same again
    assert "<html><body>Please log in" in result.stderr
    assert len(srv.requests) == 1


def test_a_huge_pipeline_answer_is_stored_cut_with_a_marker(tmp_path, monkeypatch):
    from ragbench.experiment.results import RECORDS, read_records
    from ragbench.strategies.pipeline.strategy import MAX_ANSWER_CHARS

    size = 5_000_000  # 5 MB of answer: stored whole, twice per record, before the cap
    (tmp_path / "bigpipe.py").write_text(
        f"def answer(q):\n    return {{'answer': '7463343 ' + 'x ' * {size // 2}}}\n"
    )
    monkeypatch.delitem(__import__("sys").modules, "bigpipe", raising=False)
    cfg = fake_config(
        tmp_path, strategies=[{"name": "pipeline", "params": {"target": "bigpipe:answer"}}]
    )
    cfg_data = yaml.safe_load(cfg.read_text())
    cfg_data["dataset"]["params"]["depth_percents"] = [50]
    cfg_data["dataset"]["params"]["context_lengths"] = [500]
    cfg.write_text(yaml.safe_dump(cfg_data))
    result = cli("run", cfg, "--quiet")
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    (record,) = read_records(run_dir / RECORDS).values()
    assert record.meta["answer_truncated"] == size + 8
    assert len(record.prediction) < MAX_ANSWER_CHARS + 100
    marker = (
        f"[truncated by ragbench: {size + 8:,} characters, the first {MAX_ANSWER_CHARS:,} kept]"
    )
    assert record.meta["raw"].endswith(f" {marker}") and record.prediction.endswith(marker)
    assert record.scores["string_match_all"] == 1.0  # scored as kept: the answer is in it
    assert record.cost.completion_tokens == 1 + size // 2  # counted on the whole answer
    assert sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()) < 2_000_000
