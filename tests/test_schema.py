"""One schema version for what a run stores (``ragbench.schema``): it enters the config hash, the
work keys, every record line and the manifest; a run folder or record line of another schema
(schema 1: written before the version existed, no ``schema_version`` anywhere) is refused by
every reader and by a resuming run, with one line naming the schema it was written by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragbench import schema
from ragbench.analysis.gate import load_run
from ragbench.cli import app
from ragbench.cost.reprice import reprice_run
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.results import RECORDS, read_records
from ragbench.experiment.runner import run
from ragbench.report.run_diff import compare_runs
from ragbench.workspace import tracking
from ragbench.workspace.export import export_run

HASH = "19a4f26bbed5493e31a5df85a4f2bf9e87af8fe2dc826fe8bda0cfdcf8e5afec"  # config()'s
LABELS = [
    "closed_book",
    "long_context",
    "long_context kv=sinks-4+128",
    "long_context kv=quantized-hqq-int4",
    "rag k=2 embedder=hash chunk=64 overlap=8",
]


def config(tmp_path: Path) -> dict:
    """One needle, the fake backend; every strategy family and two KV variants."""
    return {
        "name": "schema",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [400],
                "depth_percents": [50],
                "needle": "\nThe special magic number is 7463343.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "7463343",
                "tokenizer": "whitespace",
                "final_context_length_buffer": 50,
            },
        },
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
            "params": {"simulate_kv_cache": True},
        },
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 64,
            "chunk_overlap": 8,
            "tokenizer": "whitespace",
        },
        "strategies": [
            "closed_book",
            "long_context",
            {
                "name": "long_context",
                "params": {"kv": {"name": "sinks", "sink_tokens": 4, "window_tokens": 128}},
            },
            {"name": "long_context", "params": {"kv": {"name": "quantized", "bits": 4}}},
            {"name": "rag", "params": {"top_k": 2}},
        ],
        "metrics": ["string_match_all", "contains"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(tmp_path / "results"),
    }


def as_schema_1(folder: Path) -> None:
    """``folder`` as schema 1 wrote it: no ``schema_version`` in its manifest or lines."""
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["schema_version"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    lines = [json.loads(x) for x in (folder / RECORDS).read_text().splitlines()]
    (folder / RECORDS).write_text(
        "".join(
            json.dumps({k: v for k, v in x.items() if k != "schema_version"}) + "\n" for x in lines
        )
    )


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory) -> tuple[dict, Path]:
    cfg = config(tmp_path_factory.mktemp("schema"))
    df = run(cfg, progress=False)
    assert df["label"].tolist() == LABELS and df["error"].isna().all()
    return cfg, Path(df.attrs["run_dir"])


def test_the_version_is_in_the_hash_keys_records_and_manifest(v2_run):
    cfg, out = v2_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == schema.SCHEMA_VERSION == 2
    # pinned: the version is in every hash, so the next change is a deliberate new schema
    assert manifest["config_hash"] == config_hash(load_config(cfg)) == HASH
    assert out.name == f"schema-{HASH[:8]}"
    lines = [json.loads(x) for x in (out / RECORDS).read_text().splitlines()]
    assert all(x["schema_version"] == 2 and json.loads(x["key"])[0] == 2 for x in lines)
    assert json.loads(lines[3]["key"])[3]["kv"] == {
        "name": "quantized",
        "bits": 4,
        "backend": "hqq",
    }
    done = read_records(out / RECORDS)
    assert [r.params.label() for r in done.values()] == LABELS
    assert run(cfg, progress=False)["label"].tolist() == LABELS  # resumes its own folder


def test_a_schema_1_folder_is_refused_by_every_reader_with_one_line(v2_run, tmp_path):
    _, out = v2_run
    old = tmp_path / "old"
    old.mkdir()
    for name in ("manifest.json", RECORDS, "results.parquet"):
        (old / name).write_bytes((out / name).read_bytes())
    as_schema_1(old)
    expected = f"{old} was written by ragbench schema 1; this is schema 2: rerun its config"
    manifest = json.loads((old / "manifest.json").read_text())
    for read in (
        load_run,
        lambda f: reprice_run(f, "example-h100-hour"),
        lambda f: export_run(f, "csv"),
        lambda f: compare_runs(f, out),
    ):
        with pytest.raises(schema.SchemaError) as err:
            read(old)
        assert str(err.value).startswith(expected) and "\n" not in str(err.value)
    with pytest.raises(schema.SchemaError, match="schema 1; this is schema 2"):
        tracking.run_params(manifest)
    with pytest.raises(schema.SchemaError, match=rf"{old} was written by ragbench schema 1"):
        read_records(old / RECORDS)
    assert not list(old.glob("results.*.parquet"))  # nothing written beside it
    for command in (
        ["check", str(old), "--verdict", "rag"],
        ["reprice", str(old), "--price-sheet", "example-h100-hour"],
    ):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [
            f"error: {expected} (it writes a new run folder)"
        ]
    (old / "manifest.json").unlink()  # its lines alone: each says which schema wrote it
    with pytest.raises(schema.SchemaError, match=rf"{RECORDS}:1 was written by ragbench schema 1"):
        read_records(old / RECORDS)


def test_resuming_a_schema_1_folder_is_refused_with_one_line(v2_run, tmp_path):
    cfg = config(tmp_path)
    df = run(cfg | {"strategies": ["closed_book"]}, progress=False)
    out = Path(df.attrs["run_dir"])
    as_schema_1(out)
    before = (out / RECORDS).read_bytes()
    with pytest.raises(schema.SchemaError) as err:
        run(cfg | {"strategies": ["closed_book"]}, progress=False)
    assert str(err.value) == (
        f"{out} was written by ragbench schema 1; this is schema 2: rerun its config (it writes "
        "a new run folder)"
    )
    assert (out / RECORDS).read_bytes() == before


def test_a_newer_schema_is_refused_not_skipped(v2_run, tmp_path):
    _, out = v2_run
    line = json.loads((out / RECORDS).read_text().splitlines()[0])
    (tmp_path / RECORDS).write_text(json.dumps(line | {"schema_version": 3}) + "\n")
    with pytest.raises(schema.SchemaError, match="schema 3; this is schema 2: upgrade ragbench"):
        read_records(tmp_path / RECORDS)


def test_flat_kv_keys_in_a_config_are_unknown_parameters_with_file_and_line(tmp_path):
    path = tmp_path / "old.yaml"
    strategies = [{"name": "long_context", "params": {"kv_cache": "sinks", "sink_tokens": 4}}]
    path.write_text(json.dumps(config(tmp_path) | {"strategies": strategies}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}:" in str(err.value)
    assert "strategies.0: unknown long_context parameter 'kv_cache'" in str(err.value)
