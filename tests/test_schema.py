"""One schema version for what a run stores (``ragbench.schema``): it enters the config hash, the
work keys, every record line and the manifest; a run folder written by schema 1 (main before
the version existed: ``tests/fixtures/schema1-run``, written by ``niah_config`` with the fake
backend, flat ``kv_cache``/``kv_bits``/... parameters) is migrated when read and refused when
resumed."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from ragbench import schema
from ragbench.analysis.gate import load_run
from ragbench.cost.reprice import reprice_run
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.results import RECORDS, read_records
from ragbench.experiment.runner import run, run_dir_for
from ragbench.strategies.params import LongContextParams
from ragbench.workspace.export import export_run

V1 = Path(__file__).parent / "fixtures" / "schema1-run"
V1_HASH = "0e68c0ad0d27a073698e880f10ff84a095c363e8820fa39aec3cde42a5f14d2e"  # its manifest's
LABELS = [
    "closed_book",
    "long_context",
    "long_context kv=sinks-4+128",
    "long_context kv=quantized-hqq-int4",
    "rag k=2 embedder=hash chunk=64 overlap=8",
]


def v2_config(tmp_path: Path) -> dict:
    """The fixture's config, written as schema 2 writes it (kv nested), into ``tmp_path``."""
    cfg = yaml.safe_load((V1 / "config.yaml").read_text())
    for s in cfg["strategies"]:
        p = s["params"]
        if "kv_cache" in p:
            name = p.pop("kv_cache")
            rename = {
                "kv_bits": "bits",
                "sink_tokens": "sink_tokens",
                "window_tokens": "window_tokens",
            }
            p["kv"] = {"name": name, **{rename[k]: p.pop(k) for k in list(p) if k in rename}}
    return cfg | {"output_dir": str(tmp_path / "results")}


def test_a_schema_1_folder_reads_migrated_records_and_table():
    assert schema.folder_version(V1) == 1 and schema.SCHEMA_VERSION == 2
    done = read_records(V1 / RECORDS)
    assert [r.params.label() for r in done.values()] == LABELS
    assert "kv" not in list(done.values())[4].params.to_dict()  # rag: no kv
    sinks = list(done.values())[2]
    assert sinks.params == LongContextParams(kv={"name": "sinks", "window_tokens": 128})
    assert sinks.params.to_dict()["kv"] == {"name": "sinks", "sink_tokens": 4, "window_tokens": 128}
    key = json.loads(list(done)[3])  # keys as schema 2 writes them: the version first
    assert key[:3] == [2, "niah-L400-D50", "long_context"]
    assert key[3]["kv"] == {"name": "quantized", "bits": 4, "backend": "hqq"}
    df, seed = load_run(V1)  # the verdict's, export's and check's reader
    assert df["label"].tolist() == LABELS and seed == 0
    assert "kv_cache" not in df.columns and "kv_bits" in df.columns
    assert df["kv"].tolist()[1:4] == ["plain", "sinks", "quantized"]
    assert df["kv"].isna().tolist() == [True, False, False, False, True]  # long_context's only
    assert "kv" not in json.loads(df["params"][4])  # rag's params as they were
    assert df["kv_window_tokens"].tolist()[2] == 128 and df["kv_bits"].tolist()[3] == 4
    assert json.loads(df["params"][3])["kv"] == {"name": "quantized", "bits": 4, "backend": "hqq"}


def test_reprice_reads_a_schema_1_folder_and_writes_schema_2_records(tmp_path):
    folder = shutil.copytree(V1, tmp_path / "old")
    result = reprice_run(folder, "example-h100-hour")
    assert result.table["label"].tolist() == LABELS and (result.table["dollars"] > 0).all()
    lines = [json.loads(x) for x in result.records_path.read_text().splitlines()]
    assert {x["schema_version"] for x in lines} == {2}
    assert lines[3]["record"]["params"]["kv"]["bits"] == 4
    assert (folder / RECORDS).read_bytes() == (V1 / RECORDS).read_bytes()  # never rewritten


def test_resuming_a_schema_1_folder_is_refused_with_one_line(tmp_path):
    cfg = v2_config(tmp_path)
    out = run_dir_for(load_config(cfg))
    shutil.copytree(V1, out)  # as if the old folder were where this config writes
    before = (out / RECORDS).read_bytes()
    with pytest.raises(schema.SchemaError) as err:
        run(cfg, progress=False)
    assert str(err.value).startswith(
        f"error: {out} was written by ragbench schema 1; this is schema 2: rerun it"
    )
    assert "\n" not in str(err.value) and (out / RECORDS).read_bytes() == before


def test_the_version_is_in_the_hash_keys_records_and_manifest(tmp_path):
    cfg = v2_config(tmp_path)
    # the hash changed with the schema (the same config, kv nested): a new run folder
    assert config_hash(load_config(cfg)) != V1_HASH
    df = run(cfg, progress=False)
    assert df["label"].tolist() == LABELS and df["error"].isna().all()
    out = Path(df.attrs["run_dir"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == 2
    lines = [json.loads(x) for x in (out / RECORDS).read_text().splitlines()]
    assert all(x["schema_version"] == 2 and json.loads(x["key"])[0] == 2 for x in lines)
    # the migrated schema-1 records are the same records this schema writes, scores and all
    old = read_records(V1 / RECORDS)
    new = read_records(out / RECORDS)
    assert [r.params for r in old.values()] == [r.params for r in new.values()]
    assert [r.prediction for r in old.values()] == [r.prediction for r in new.values()]
    assert df.equals(run(cfg, progress=False))  # resumes its own folder


def test_flat_kv_keys_in_a_config_name_the_nested_form_with_file_and_line(tmp_path):
    path = tmp_path / "old.yaml"
    shutil.copy(V1 / "config.yaml", path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert f"{path}:" in message and "strategies.2" in message
    # the variant the old keys named (strategies.2 is a sinks point), not a stock example
    assert message.endswith(
        "strategies.2: unknown long_context parameter 'kv_cache'; the variant is now nested: "
        "kv: {name: sinks, sink_tokens: 4, window_tokens: 128}"
    )


def test_exporting_a_schema_1_folder_rebuilds_its_questions(tmp_path, caplog):
    folder = shutil.copytree(V1, tmp_path / "old")
    for fmt in ("csv", "lm-eval"):
        export_run(folder, fmt)
    assert "questions left empty" not in caplog.text
    rows = list(csv.DictReader((folder / "export" / "samples.csv").open()))
    assert len(rows) == 5 and {r["question"] for r in rows} == {
        "What is the special magic number mentioned in the text?"
    }
    samples = sorted((folder / "export" / "lm-eval").rglob("samples_*.jsonl"))
    assert len(samples) == 5 and all("magic number" in p.read_text() for p in samples)
    # its records (schema 1's parameters, without later defaults) still find their rows, so
    # each sample's arg_0 is the prompt rebuilt, not the question
    firsts = [json.loads(p.read_text().splitlines()[0]) for p in samples]
    assert [s["ragbench"]["arg_0"] for s in firsts] == ["prompt"] * 5


def test_a_schema_1_config_grid_migrates_to_kv_axes():
    config = {
        "strategies": [
            {"name": "rag", "params": {"top_k": [2, 4]}},
            {
                "name": "long_context",
                "params": {
                    "kv_cache": ["plain", "quantized"],
                    "kv_bits": [4, 8],
                    "overflow": "truncate_middle",
                },
            },
        ]
    }
    migrated = schema.migrate_config(config, 1)
    assert migrated["strategies"][0] == config["strategies"][0]
    assert migrated["strategies"][1]["params"] == {
        "overflow": "truncate_middle",
        "kv": [
            {"name": "plain"},
            {"name": "quantized", "bits": 4},
            {"name": "quantized", "bits": 8},
        ],
    }
    points = LongContextParams.grid(migrated["strategies"][1]["params"])
    assert [p.label() for p in points] == [
        "long_context truncate_middle",
        "long_context truncate_middle kv=quantized-hqq-int4",
        "long_context truncate_middle kv=quantized-hqq-int8",
    ]
    assert schema.migrate_config(config, 2) is config


def test_a_newer_schema_is_refused_not_skipped(tmp_path):
    line = json.loads((V1 / RECORDS).read_text().splitlines()[0])
    (tmp_path / RECORDS).write_text(json.dumps(line | {"schema_version": 3}) + "\n")
    with pytest.raises(schema.SchemaError, match="schema 3; this is schema 2"):
        read_records(tmp_path / RECORDS)
