"""`ragbench run --set/--limit/--threads` and `ragbench list`, through the real CLI app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError, apply_overrides

FAKE = Path(__file__).parents[1] / "configs" / "fake.yaml"


def test_overrides_are_yaml_dotted_paths_validated_like_the_file():
    cfg = load_config(
        FAKE,
        [
            "model.max_new_tokens=64",
            "strategies[2].params.top_k=[2,4]",
            "strategies[0].params={}",
            "dataset.limit=3",
        ],
    )
    assert cfg.model.max_new_tokens == 64 and cfg.dataset.limit == 3
    assert cfg.strategies[2].params["top_k"] == [2, 4]
    assert cfg.strategies[0].name == "closed_book"  # `- closed_book` expanded to {name: ...}
    assert cfg._overrides[0] == "model.max_new_tokens=64"
    assert config_hash(cfg) != config_hash(load_config(FAKE))
    with pytest.raises(ConfigError, match="max_new_tokens.*greater than or equal to 1"):
        load_config(FAKE, ["model.max_new_tokens=0"])
    with pytest.raises(ConfigError, match="did you mean 'max_new_tokens'"):
        load_config(FAKE, ["model.max_new_token=8"])
    with pytest.raises(ConfigError, match=r"strategies has no item \[9\] \(valid: 0\.\.3\)"):
        load_config(FAKE, ["strategies[9].params.top_k=2"])
    with pytest.raises(ConfigError, match="expected dotted.path=value"):
        load_config(FAKE, ["model.max_new_tokens"])
    data = {"a": {"b": 1}}
    assert apply_overrides(data, ["a.c.d=x"]) == {"a": {"b": 1, "c": {"d": "x"}}}
    assert data == {"a": {"b": 1}}  # the input is not modified


def test_threads_are_not_part_of_the_hash():
    assert config_hash(load_config(FAKE, ["model.threads=1"])) == config_hash(load_config(FAKE))


def test_run_with_set_limit_and_threads_records_the_overrides(tmp_path):
    import torch

    before = torch.get_num_threads()
    try:
        result = CliRunner().invoke(
            app,
            [
                "run",
                str(FAKE),
                "--quiet",
                "--output-dir",
                str(tmp_path),
                "--limit",
                "2",
                "--threads",
                "1",
                "--set",
                "strategies[2].params.top_k=2",
            ],
        )
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 1  # model.threads reached torch
    finally:
        torch.set_num_threads(before)
    [manifest] = tmp_path.glob("fake-*/manifest.json")
    manifest = json.loads(manifest.read_text())
    assert manifest["overrides"] == [
        "strategies[2].params.top_k=2",
        "dataset.limit=2",
        "model.threads=1",
    ]
    assert manifest["dataset"]["n"] == 2  # the first 2 examples
    assert manifest["config"]["strategies"][2]["params"]["top_k"] == 2
    bad = CliRunner().invoke(app, ["run", str(FAKE), "--set", "model.backend=fak", "--dry-run"])
    assert bad.exit_code == 2 and "did you mean 'fake'" in bad.output


@pytest.mark.parametrize(
    "kind, name",
    [
        ("datasets", "niah"),
        ("strategies", "rag"),
        ("metrics", "f1"),
        ("models", "smollm2-135m-instruct"),
        ("price-sheets", "example-hosted-api"),
        ("retrievers", "bm25"),
        ("embedders", "hash"),
    ],
)
def test_list_names_every_registry_entry_with_a_description(kind, name):
    result = CliRunner().invoke(app, ["list", kind])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    [line] = [x for x in lines if x.split()[0] == name]
    assert len(line.split(None, 1)) == 2, line  # a description follows the name
    if kind != "price-sheets":
        assert all(len(x.split(None, 1)) == 2 for x in lines), lines


def test_list_of_an_unknown_kind_names_the_valid_ones():
    result = CliRunner().invoke(app, ["list", "metric"])
    assert result.exit_code == 2 and "did you mean 'metrics'" in result.output


def test_sigterm_exits_unwinds_once_and_restores_what_was_there(capsys):
    """The one SIGTERM handler of `run`, `compare`, `data docs`, `sweep` and the runner: it
    raises Terminated (exit 143) once, so finally blocks run; a second SIGTERM while they run is
    ignored; the handler before it comes back; ``replace=False`` leaves a program's own handler
    and an ignored SIGTERM stays ignored."""
    import os
    import signal

    from ragbench.io import TERMINATED_EXIT, Terminated, sigterm_exits

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(Terminated) as stopped, sigterm_exits(resume="run it again"):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("SIGTERM did not stop the block")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while unwinding: ignored
            cleaned.append(True)
    assert stopped.value.code == TERMINATED_EXIT == 143 and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == "interrupted by SIGTERM: run it again\n"

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("own"))
    try:
        with sigterm_exits(replace=False):  # the runner inside a program that handles SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)
        assert seen == ["own"]
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with sigterm_exits():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
