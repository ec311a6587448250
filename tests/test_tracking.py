"""MLflow tracking against a real local store (SQLite in tmp_path): the logged metrics equal
the run's summary, params hold the config and its hash, the MLflow run id is kept in the
manifest and a resumed run logs to the same MLflow run; sweeps log a parent and children;
exports (jsonl, csv, lm-eval) carry the table's rows; repeated third-party log lines once."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from test_runner import niah_config
from typer.testing import CliRunner

import ragbench
from ragbench.cli import app
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.log_once import once_per_run
from ragbench.workspace import tracking
from ragbench.workspace.export import export_run, slug

pytest.importorskip("mlflow")  # the `tracking` extra (in `dev`: make setup installs it)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module: creating its tables takes seconds."""
    return str(tmp_path_factory.mktemp("mlruns"))


def _client(store):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking.store_uri(store))


def _config(tmp_path, store, experiment):
    cfg = niah_config(
        tmp_path,
        strategies=["closed_book", "long_context", {"name": "rag", "params": {"top_k": [1, 4]}}],
    )
    cfg["metrics"] = ["contains", "string_match_all"]
    cfg["price_sheet"] = "example-hosted-api"
    cfg["tracking"] = {"mlflow": {"tracking_uri": store, "experiment": experiment}}
    return cfg


def test_the_tracking_section_is_validated_and_not_hashed(tmp_path, store):
    cfg = _config(tmp_path, store, "x")
    plain = {k: v for k, v in cfg.items() if k != "tracking"}
    assert config_hash(load_config(cfg)) == config_hash(load_config(plain))
    bad = {**cfg, "tracking": {"mlflow": {"tracking_url": store}}}
    with pytest.raises(ConfigError, match="did you mean 'tracking_uri'"):
        load_config(bad)
    with pytest.raises(ConfigError, match="unknown key 'wandb'"):
        load_config({**cfg, "tracking": {"wandb": {}}})


# the metric key each variant's label is logged under (written out, not computed by slug())
KEYS = {
    "closed_book": "closed_book",
    "long_context": "long_context",
    "rag k=1 embedder=hash chunk=64 overlap=8": "rag_k-1_embedder-hash_chunk-64_overlap-8",
    "rag k=4 embedder=hash chunk=64 overlap=8": "rag_k-4_embedder-hash_chunk-64_overlap-8",
}


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's 95% interval for a 0/1 score, from its formula."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_logged_values_equal_the_results_table_and_a_resume_reuses_the_run(tmp_path, store):
    df = ragbench.run(_config(tmp_path, store, "equal"), progress=False)
    run_id = df.attrs["mlflow_run_id"]
    client = _client(store)
    logged = client.get_run(run_id)
    metrics = logged.data.metrics
    # the expected values computed here from the stored rows, not by the code that logs them
    table = pd.read_parquet(Path(df.attrs["run_dir"]) / "results.parquet")
    assert sorted(table["label"].unique()) == sorted(KEYS)
    for label, key in KEYS.items():
        rows = table[(table["label"] == label) & table["error"].isna()]
        assert logged.data.tags[f"variant.{key}"] == label
        hits = int(rows["contains"].sum())
        assert metrics[f"{key}/contains"] == pytest.approx(hits / len(rows))
        assert metrics[f"{key}/contains.n"] == len(rows) == 4
        low, high = wilson(hits, len(rows))
        assert metrics[f"{key}/contains.ci_low"] == pytest.approx(low, abs=1e-9)
        assert metrics[f"{key}/contains.ci_high"] == pytest.approx(high, abs=1e-9)
        assert metrics[f"{key}/dollars_per_1k"] == pytest.approx(1000 * rows["dollars"].mean())
        assert metrics[f"{key}/latency_seconds"] == pytest.approx(rows["latency_seconds"].mean())
        assert metrics[f"{key}/prompt_tokens"] == pytest.approx(rows["prompt_tokens"].mean())
    assert metrics["long_context/contains.ci_low"] < 1.0  # the interval bounds
    # the per-question table (mlflow.log_table): one row per question x variant
    experiment_id = logged.info.experiment_id
    rows = client.load_table(experiment_id, "questions.json", run_ids=[run_id])
    assert len(rows) == len(table) == 16
    assert list(rows.columns[:9]) == [
        "example_id",
        "label",
        "question",
        "answers",
        "prediction",
        "contains",
        "dollars",
        "latency_seconds",
        "error",
    ]
    assert set(rows["question"]) == {"What is the special magic number mentioned in the text?"}
    mine = table.set_index(["example_id", "label"])
    for row in rows.to_dict("records"):
        stored = mine.loc[(row["example_id"], row["label"])]
        assert row["prediction"] == stored["prediction"]
        assert row["contains"] == stored["contains"] and list(row["answers"]) == ["7463343"]
        assert row["dollars"] == pytest.approx(stored["dollars"])
    assert json.loads(logged.data.tags["mlflow.loggedArtifacts"]) == [
        {"path": "questions.json", "type": "table"}
    ]
    manifest = json.loads((tmp_path / "results").glob("*/manifest.json").__next__().read_text())
    params = logged.data.params
    assert params["config_hash"] == manifest["config_hash"]
    assert params["model.backend"] == "fake" and params["dataset.name"] == "niah"
    assert params["price_sheet.name"] == "example-hosted-api"
    assert params["price_sheet.date"] == manifest["price_sheet"]["date"]
    tags = logged.data.tags
    assert tags["ragbench.version"] == ragbench.__version__
    assert tags["ragbench.verdict"] and "Evidence:" not in tags["ragbench.verdict"]
    if manifest.get("git_commit"):
        assert tags["mlflow.source.git.commit"] == manifest["git_commit"]
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"results.parquet", "manifest.json"} <= names
    assert manifest["tracking"]["mlflow"]["run_id"] == run_id
    # a resumed run (nothing pending) logs to the same MLflow run, at the next step
    again = ragbench.run(_config(tmp_path, store, "equal"), progress=False)
    assert again.attrs["mlflow_run_id"] == run_id
    experiment = client.get_experiment_by_name("equal")
    assert len(client.search_runs([experiment.experiment_id])) == 1
    history = client.get_metric_history(run_id, "long_context/contains")
    assert [m.step for m in history] == [0, 1]
    # the resume replaced the question table (log_table alone would have appended to it)
    assert len(client.load_table(experiment_id, "questions.json", run_ids=[run_id])) == 16
    assert client.get_run(run_id).data.tags["ragbench.questions_table"] == "questions.json"
    manifest = json.loads(next((tmp_path / "results").glob("*/manifest.json")).read_text())
    assert manifest["tracking"]["mlflow"]["run_id"] == run_id  # kept by the resume's manifest


def test_run_command_with_mlflow_uri(tmp_path, store):
    cfg = _config(tmp_path, store, "unused")
    del cfg["tracking"]
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(
        app, ["run", str(path), "--quiet", "--mlflow-uri", store, "--mlflow-experiment", "cli"]
    )
    assert result.exit_code == 0, result.output
    assert "mlflow: run " in result.output
    client = _client(store)
    [logged] = client.search_runs([client.get_experiment_by_name("cli").experiment_id])
    assert logged.data.params["name"] == "t-niah"


@pytest.mark.parametrize("form", ["file:{}", "file://{}"])
def test_a_file_uri_is_refused_before_the_run(tmp_path, form):
    """``file:/path`` used to log into a folder literally named ``./file:/path``, and
    ``file:///path`` to end in MLflow's traceback after the run: both are one error line now,
    before anything runs, from the command line and from a config."""
    uri = form.format(tmp_path / "mlruns")
    cfg = _config(tmp_path, "unused", "unused")
    del cfg["tracking"]
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet", "--mlflow-uri", uri])
    assert result.exit_code == 2, result.output
    expected = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    [line] = [x for x in result.output.splitlines() if x.strip()]
    assert line.startswith(f"error: MLflow URI {uri!r}") and expected in line
    assert not (tmp_path / "results").exists()  # nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # no folder named file:
    with pytest.raises(ConfigError, match=r"tracking\.mlflow\.tracking_uri: .*sqlite:///"):
        load_config({**cfg, "tracking": {"mlflow": {"tracking_uri": uri}}})


def test_a_sweep_is_a_parent_with_a_child_per_point(tmp_path, store):
    cfg = _config(tmp_path, store, "unused")
    del cfg["tracking"]
    sweep_dir = tmp_path / "sweep"
    points = []
    for k in (1, 2):
        cfg["output_dir"] = str(sweep_dir / f"k{k}")
        cfg["dataset"]["limit"] = k
        ragbench.run(cfg, progress=False)
        points.append(SimpleNamespace(point_id=f"k{k}", status="done", params={"limit": k}))
    points.append(SimpleNamespace(point_id="k3", status="failed", params={"limit": 3}))
    outcome = SimpleNamespace(
        sweep_dir=sweep_dir,
        points=points,
        failed=[points[-1]],
        count=lambda status: sum(p.status == status for p in points),
    )
    where = tracking.Tracking(store, "sweeps")
    parent = tracking.log_sweep(outcome, tmp_path / "grid.yaml", where, "**/results.parquet")
    client = _client(store)
    runs = client.search_runs([client.get_experiment_by_name("sweeps").experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
    assert len(runs) == 3 and len(children) == 2
    assert {r.data.params["point.limit"] for r in children} == {"1", "2"}
    assert client.get_run(parent).data.metrics["points_failed"] == 1
    again = tracking.log_sweep(outcome, tmp_path / "grid.yaml", where, "**/results.parquet")
    assert again == parent
    assert len(client.search_runs([client.get_experiment_by_name("sweeps").experiment_id])) == 3


def test_settings_and_store_uri(tmp_path, monkeypatch):
    assert tracking.settings(None) is None
    assert tracking.settings(None, mlflow=True) == tracking.Tracking(None, "ragbench")
    monkeypatch.chdir(tmp_path)
    assert tracking.store_uri(None) == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert tracking.store_uri("http://host:5000") == "http://host:5000"
    assert tracking.store_uri("runs/ml") == f"sqlite:///{tmp_path / 'runs' / 'ml' / 'mlflow.db'}"
    # MLflow's file store: refused, naming the SQLite form of the same folder
    for uri in (f"file:{tmp_path}/mlruns", f"file://{tmp_path}/mlruns", "FILE:mlruns"):
        with pytest.raises(tracking.TrackingError) as err:
            tracking.check(tracking.Tracking(uri))
        assert f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}" in str(err.value)
    assert not any("file:" in p.name for p in tmp_path.iterdir())
    assert slug("rag k=4 order=document") == "rag_k-4_order-document"
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tracking.TrackingError, match=r"pip install 'ragbench\[tracking\]'"):
        tracking.check_available()


def test_importing_ragbench_imports_no_mlflow():
    code = (
        "import sys, ragbench, ragbench.workspace.tracking, ragbench.cli; "
        "print('mlflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_exports_carry_the_rows(tmp_path):
    cfg = _config(tmp_path, "unused", "unused")
    del cfg["tracking"]
    df = ragbench.run(cfg, progress=False)
    run_dir = df.attrs["run_dir"]
    [jsonl] = export_run(run_dir, "jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(rows) == len(df)
    assert rows[0]["question"] == "What is the special magic number mentioned in the text?"
    assert {"prediction", "answers", "contains", "prompt_tokens", "dollars"} <= set(rows[0])
    assert [r["contains"] for r in rows] == list(df["contains"])
    [csv_path] = export_run(run_dir, "csv", tmp_path / "rows.csv")
    assert csv_path.read_text().splitlines()[0].startswith("example_id,variant,strategy")
    files = export_run(run_dir, "lm-eval", tmp_path / "lm")
    results = json.loads(files[0].read_text())
    assert files[0].parent.name == "fake" and files[0].name.startswith("results_")
    assert {
        "results",
        "configs",
        "versions",
        "n-shot",
        "higher_is_better",
        "n-samples",
        "config",
    } <= set(results)
    task = "t-niah_long_context"
    mean = df[df["label"] == "long_context"]["contains"].mean()
    assert results["results"][task]["contains,none"] == pytest.approx(mean)
    assert results["n-samples"][task] == {"original": 4, "effective": 4}
    date_id = files[0].stem.removeprefix("results_")
    sample_file = files[0].parent / f"samples_{task}_{date_id}.jsonl"
    assert sample_file in files
    sample = json.loads(sample_file.read_text().splitlines()[0])
    assert {
        "doc_id",
        "doc",
        "target",
        "arguments",
        "resps",
        "filtered_resps",
        "filter",
        "metrics",
        "doc_hash",
        "prompt_hash",
        "target_hash",
        "contains",
    } <= set(sample)
    assert sample["target"] == "7463343" and sample["arguments"]["gen_args_0"]["arg_0"]
    with pytest.raises(ValueError, match="valid: jsonl, csv, lm-eval"):
        export_run(run_dir, "parquet")
    result = CliRunner().invoke(app, ["export", run_dir, "--format", "csv"])
    assert result.exit_code == 0 and result.output.strip().endswith("samples.csv")


def test_repeated_third_party_log_lines_are_shown_once(caplog):
    other = logging.getLogger("llama_index.core.readers.file.base")
    with caplog.at_level(logging.WARNING), once_per_run():
        for _ in range(4):
            other.warning("`llama-index-readers-file` package not found")
            logging.getLogger("ragbench.x").warning("ours, every time")
    texts = [r.getMessage() for r in caplog.records]
    assert texts.count("`llama-index-readers-file` package not found") == 1
    assert texts.count("ours, every time") == 4
    assert "repeats dropped: llama_index.core.readers.file.base (3)" in texts[-1]
    other.warning("`llama-index-readers-file` package not found")  # after the run: shown
    assert [r.getMessage() for r in caplog.records].count(texts[0]) == 2
