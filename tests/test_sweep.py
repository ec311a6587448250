"""Papermill sweeps: grid expansion, validation before execution, failures, resume, results."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from ragbench.workspace.sweep.run import execute_sweep
from ragbench.workspace.sweep.spec import (
    SweepSpec,
    SweepSpecError,
    expand_grid,
    load_spec,
    point_id,
)

FIXTURE = Path(__file__).parent / "fixtures" / "notebooks" / "sweep_point.ipynb"


def write_spec(folder: Path, name: str = "sweep.yaml", **spec) -> Path:
    spec.setdefault("notebook", str(FIXTURE))
    spec.setdefault("output_dir", str(folder / "out"))
    path = folder / name
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


# --- pure: grid expansion and spec validation -----------------------------------------------------


def test_expand_grid_is_deterministic_cartesian_in_yaml_order():
    spec = SweepSpec(notebook="nb.ipynb", parameters={"k": 4}, grid={"a": [1, 2], "b": ["x", "y"]})
    points = expand_grid(spec)
    assert points == [
        {"k": 4, "a": 1, "b": "x"},
        {"k": 4, "a": 1, "b": "y"},
        {"k": 4, "a": 2, "b": "x"},
        {"k": 4, "a": 2, "b": "y"},
    ]
    assert expand_grid(spec.model_dump()) == points
    assert expand_grid(SweepSpec(notebook="nb.ipynb", parameters={"k": 4})) == [{"k": 4}]


def test_point_ids_are_stable_safe_and_distinct():
    params = {"k": 4, "model": "smollm2 135m/instruct", "depth": 0.5}
    pid = point_id(params, ["model", "depth"])
    assert pid == point_id(dict(reversed(params.items())), ["model", "depth"])
    assert pid.startswith("model=smollm2-135m-instruct,depth=0.5-")
    assert re.fullmatch(r"[A-Za-z0-9=.,+_-]+", pid)
    # the hash covers fixed parameters too: same slug, different point
    other = point_id({**params, "k": 8}, ["model", "depth"])
    assert other != pid and other.rsplit("-", 1)[0] == pid.rsplit("-", 1)[0]


def test_spec_errors_name_file_and_key(tmp_path):
    bad = write_spec(tmp_path, gird={"x": [1]})  # yaml.safe_dump sorts keys: gird is line 1
    with pytest.raises(
        SweepSpecError, match=r"sweep\.yaml:1: gird: unknown key 'gird'; did you mean 'grid'"
    ):
        load_spec(bad)
    empty = write_spec(tmp_path, "empty.yaml", grid={"x": []})  # grid: line 1, x: line 2
    with pytest.raises(SweepSpecError, match=r"empty\.yaml:2: grid\.x: needs at least one value"):
        load_spec(empty)
    repeated = write_spec(tmp_path, "repeated.yaml", grid={"x": [1, 1]})
    with pytest.raises(SweepSpecError, match=r"repeated\.yaml:2: grid\.x: repeated values"):
        load_spec(repeated)
    both = write_spec(tmp_path, "both.yaml", parameters={"x": 1}, grid={"x": [2]})  # x: line 2
    with pytest.raises(SweepSpecError, match=r"both\.yaml:2: grid\.x: 'x' is also set in param"):
        load_spec(both)
    fak = write_spec(tmp_path, "fak.yaml", grid={"backend": ["fake", "fak"]})
    with pytest.raises(
        SweepSpecError, match=r"fak\.yaml:2: grid\.backend: unknown LLM backend 'fak'; did you"
    ):
        load_spec(fak)


def test_unknown_or_mistyped_parameter_fails_before_any_execution(tmp_path):
    spec = write_spec(tmp_path, grid={"xx": [1, 2]})  # grid: line 1, xx: line 2
    with pytest.raises(
        SweepSpecError, match=r"sweep\.yaml:2: grid\.xx: unknown parameter 'xx'.*did you mean 'x'"
    ):
        execute_sweep(spec)
    typed = write_spec(tmp_path, "typed.yaml", grid={"x": [1, "two"]})
    with pytest.raises(
        SweepSpecError, match=r"typed\.yaml:2: grid\.x: parameter 'x' is declared int, got 'two'"
    ):
        execute_sweep(typed)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
    with pytest.raises(SweepSpecError, match="unknown executor 'rey'; did you mean 'ray'"):
        execute_sweep(spec, executor="rey")
    from typer.testing import CliRunner

    from ragbench.cli import app

    result = CliRunner().invoke(app, ["sweep", str(spec)])
    assert result.exit_code == 2 and "grid.xx: unknown parameter 'xx'" in result.output
    assert "point/s" not in result.output  # the error alone: no empty progress bar above it


# --- one real 3-point sweep (x=2 fails on purpose), rerun twice -----------------------------------


@pytest.fixture(scope="module")
def sweep_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    spec = write_spec(folder, parameters={"fail_at": 2, "scale": 2.0}, grid={"x": [1, 2, 3]})
    summary = folder / "out" / "summary.json"
    first = execute_sweep(spec, workers=2)
    mtimes = {p.point_id: os.stat(p.notebook).st_mtime_ns for p in first.points}
    rerun = execute_sweep(spec, workers=2)  # done points skipped, the failed one retried
    rerun_summary = json.loads(summary.read_text(encoding="utf-8"))
    no_retry = execute_sweep(spec, rerun_failed=False)  # nothing executes
    no_retry_summary = json.loads(summary.read_text(encoding="utf-8"))
    return {
        "spec": spec,
        "first": first,
        "rerun": rerun,
        "no_retry": no_retry,
        "mtimes": mtimes,
        "summaries": {"rerun": rerun_summary, "no_retry": no_retry_summary},
    }


def statuses(outcome) -> dict[int, str]:
    """x -> status, "(skipped)" when the sweep reported a point it did not execute itself."""
    return {p.params["x"]: p.status + (" (skipped)" if p.skipped else "") for p in outcome.points}


def test_failing_point_is_reported_with_cell_and_error_others_complete(sweep_runs):
    first = sweep_runs["first"]
    assert statuses(first) == {1: "done", 2: "failed", 3: "done"}
    (failed,) = first.failed
    assert failed.error == "ValueError: deliberate failure at x=2"
    executed = nbformat.read(failed.notebook, as_version=4)
    assert "raise ValueError" in executed.cells[failed.cell].source
    assert executed.cells[failed.cell].execution_count == failed.exec_count == 4
    marker = json.loads((Path(failed.notebook).parent / "failed.json").read_text())
    assert marker["cell"] == failed.cell and marker["params"] == {
        "fail_at": 2,
        "scale": 2.0,
        "x": 2,
    }
    assert not (Path(failed.notebook).parent / "done.json").exists()
    for point in first.points:
        assert Path(point.notebook).exists()
        assert f"x={point.params['x']}" in Path(point.notebook).name  # named from parameters


def test_results_of_all_done_points_form_one_table(sweep_runs):
    results = sweep_runs["first"].results
    assert sorted(results["x"].unique()) == [1, 3]  # the failed point has no rows
    assert set(results.columns) >= {"metric", "value", "x", "fail_at", "scale", "point_id"}
    y = results[results["metric"] == "y"].set_index("x")["value"]
    assert y.to_dict() == {1: 2.0, 3: 6.0}  # computed by the notebook: x * scale
    on_disk = pd.read_parquet(sweep_runs["first"].sweep_dir / "results.parquet")
    pd.testing.assert_frame_equal(on_disk, results)


def test_rerun_skips_done_points_and_retries_failed(sweep_runs):
    rerun = sweep_runs["rerun"]
    assert statuses(rerun) == {1: "done (skipped)", 2: "failed", 3: "done (skipped)"}
    assert rerun.failed[0].seconds > 0  # really executed again
    for point in rerun.points:
        if point.skipped:
            assert os.stat(point.notebook).st_mtime_ns == sweep_runs["mtimes"][point.point_id]
    pd.testing.assert_frame_equal(rerun.results, sweep_runs["first"].results)


def test_resumed_points_keep_their_first_completion(sweep_runs):
    # a resumed sweep used to report "skipped, 0.0 s" for points done earlier, in its outcome
    # and in summary.json: the time and duration of the real execution were lost
    first = {p.point_id: p for p in sweep_runs["first"].points}
    for name in ("rerun", "no_retry"):
        later, summary = sweep_runs[name], sweep_runs["summaries"][name]
        assert summary == [dataclasses.asdict(p) for p in later.points]
        for point, stored in zip(later.points, summary, strict=True):
            if point.params["x"] == 2:
                continue  # the failed point ran again in the rerun
            original = first[point.point_id]
            assert original.status == "done" and not original.skipped
            assert point.skipped and stored["skipped"] is True
            assert stored["status"] == "done"
            assert stored["seconds"] == point.seconds == original.seconds > 0
            assert stored["finished_at"] == point.finished_at == original.finished_at
            marker = json.loads((Path(point.notebook).parent / "done.json").read_text())
            assert marker["seconds"] == original.seconds
            assert marker["finished_at"] == original.finished_at
            finished = datetime.fromisoformat(original.finished_at)
            assert finished.utcoffset() == timedelta(0)  # UTC, comparable across machines


def test_rerun_without_retry_reports_the_recorded_failure(sweep_runs):
    no_retry = sweep_runs["no_retry"]
    assert statuses(no_retry) == {1: "done (skipped)", 2: "failed (skipped)", 3: "done (skipped)"}
    (failed,) = no_retry.failed
    assert failed.cell == sweep_runs["first"].failed[0].cell
    assert "deliberate failure" in failed.error
    recorded = sweep_runs["rerun"].failed[0]  # the last execution of the point
    assert (failed.seconds, failed.finished_at) == (recorded.seconds, recorded.finished_at)


def test_a_failed_point_is_described_and_cli_summarises(sweep_runs):
    from typer.testing import CliRunner

    outcome = execute_sweep(sweep_runs["spec"], rerun_failed=False)
    assert len(outcome.results) == 4
    (failed,) = outcome.failed
    assert re.search(
        r"x=2-.*cell \d+ \(In \[4\]\): ValueError: deliberate failure", failed.describe()
    )

    import typer

    from ragbench.cli.sweep import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["sweep", str(sweep_runs["spec"]), "--no-rerun-failed"])
    assert result.exit_code == 1, result.output  # a failed point makes the command fail
    assert "0 done, 2 skipped, 1 failed" in result.output
    assert re.search(
        r"failed .*cell \d+ \(In \[4\]\): ValueError: deliberate failure at x=2", result.output
    )


def plant_temp(folder: Path, name: str) -> Path:
    """A temporary file as ``io.atomic_write_bytes`` names it, as a kill -9 mid-save leaves it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.write(fd, b'{"half": ')
    os.close(fd)
    return Path(tmp)


def test_a_point_run_again_removes_the_temp_files_an_interrupted_save_left(tmp_path, caplog):
    spec = write_spec(tmp_path, grid={"x": [1, 2]})
    done, killed = execute_sweep(spec).points
    # x=2 was killed while saving: its temp files are there, its marker is not
    folder = Path(killed.notebook).parent
    (folder / "done.json").unlink()
    stale = [plant_temp(folder, Path(killed.notebook).name), plant_temp(folder, "done.json")]
    not_ours = [folder / name for name in ("notes.tmp", ".notes.tmp", ".a.ipynb.12345678.tmp.bak")]
    (folder / "sub").mkdir()
    not_ours += [plant_temp(folder / "sub", "results.parquet")]  # only the point's own files
    for path in not_ours:
        path.touch()
    left_alone = plant_temp(Path(done.notebook).parent, Path(done.notebook).name)  # not rerun

    with caplog.at_level(logging.WARNING, logger="ragbench.workspace.sweep.point"):
        rerun = execute_sweep(spec)
    assert statuses(rerun) == {1: "done (skipped)", 2: "done"}
    assert [p.exists() for p in stale] == [False, False]
    assert all(p.exists() for p in not_ours) and left_alone.exists()
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and all("left by an interrupted execution" in m for m in logged)
    assert {p.name for p in stale} == {m.split(": removed ")[1].split(",")[0] for m in logged}


@pytest.mark.slow
def test_ray_executor_on_a_local_ray(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed")
    spec = write_spec(tmp_path, grid={"x": [1, 3]})
    outcome = execute_sweep(spec, workers=2, executor="ray")
    assert statuses(outcome) == {1: "done", 3: "done"}
    assert all(Path(p.notebook).with_name(".lock").exists() for p in outcome.points)
    y = outcome.results[outcome.results["metric"] == "y"].set_index("x")["value"]
    assert y.to_dict() == {1: 2.0, 3: 6.0}


def test_a_list_parameter_given_scalars_fails_before_any_point_runs(tmp_path):
    # notebook 03 declares `chunk_sizes: list`: a grid `chunk_sizes: [64, 128]` hands each point
    # an int, which used to fail inside every point with "'int' object is not iterable"
    notebook = Path(__file__).parents[1] / "notebooks" / "03_retrieval_tuning.ipynb"
    spec = tmp_path / "tuning.yaml"
    spec.write_text(
        f"notebook: {notebook}\ngrid:\n  chunk_sizes: [64, 128]\noutput_dir: {tmp_path / 'out'}\n"
    )
    with pytest.raises(SweepSpecError) as caught:
        execute_sweep(spec)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and all("parameter 'chunk_sizes' is declared list" in x for x in lines)
    assert "got 64" in lines[0] and "lists lists" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_missing_kernel_is_one_clear_error_before_any_point(tmp_path):
    spec = write_spec(tmp_path, grid={"x": [1, 2]})
    text = spec.read_text() + "kernel: no-such-kernel\n"
    spec.write_text(text)
    with pytest.raises(
        SweepSpecError, match=r"kernel 'no-such-kernel' is not installed.*installed: "
    ):
        execute_sweep(spec)
    assert not (tmp_path / "out").exists()


def test_notebooks_ask_for_the_project_kernel():
    import nbformat

    from ragbench.workspace.kernels import PROJECT_KERNEL, resolve_kernel

    for path in sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb")):
        assert nbformat.read(path, 4).metadata["kernelspec"]["name"] == PROJECT_KERNEL, path
    nb = Path(__file__).parents[1] / "notebooks" / "00_quickstart.ipynb"
    assert resolve_kernel(nb) == PROJECT_KERNEL  # installed by `make setup`
    assert resolve_kernel(nb, "python3") == "python3"


def test_a_spec_setting_the_output_parameter_is_refused_naming_file_line_and_key(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("notebook: nb.ipynb\nparameters:\n  output_dir: elsewhere\n")
    with pytest.raises(SweepSpecError, match=r"s.yaml:3: parameters.output_dir: the sweep sets"):
        load_spec(spec)


def test_a_stopped_sweep_records_the_points_it_finished(tmp_path, monkeypatch):
    """SIGTERM or Ctrl-C after the first point: summary.json and results.parquet already hold
    it (they used to wait for a rerun), and the stop is not swallowed."""
    from ragbench.workspace.sweep import run as sweep_run

    spec = write_spec(tmp_path, parameters={"fail_at": 99, "scale": 1.0}, grid={"x": [1, 2]})
    real = sweep_run.execute_point
    calls = []

    def stop_at_second(job):
        calls.append(job["point_id"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # what the signal handler raises in the sweep process
        return real(job)

    monkeypatch.setattr(sweep_run, "execute_point", stop_at_second)
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(spec, workers=1)
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert [(p["params"]["x"], p["status"]) for p in summary] == [(1, "done")]
    assert sorted(pd.read_parquet(out / "results.parquet")["x"].unique()) == [1]


def test_sweep_with_mlflow_logs_a_parent_and_each_points_run(tmp_path):
    """``ragbench sweep --mlflow`` end to end: notebooks/sweeps/fake_smoke.yaml (the quickstart
    notebook on the fake backend), its runs read back from the SQLite store: a parent for the
    sweep, a child per point holding that point's parameter, its metrics and its question
    table."""
    pytest.importorskip("mlflow")  # the `tracking` extra
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from ragbench.cli import app

    smoke = Path(__file__).parents[1] / "notebooks" / "sweeps" / "fake_smoke.yaml"
    spec = yaml.safe_load(smoke.read_text(encoding="utf-8"))
    spec["notebook"] = str((smoke.parent / spec["notebook"]).resolve())
    spec["output_dir"] = str(tmp_path / "sweep")
    path = tmp_path / "fake_smoke.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    store = tmp_path / "mlruns"
    args = [
        "sweep",
        str(path),
        "--workers",
        "2",
        "--mlflow-uri",
        str(store),
        "--mlflow-experiment",
        "smoke",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    [parent_id] = re.findall(r"mlflow: sweep run (\w+) \(experiment smoke\)", result.output)

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert len(runs) == 3 and len(children) == 2
    parent = client.get_run(parent_id)
    assert parent.data.metrics == {"points_done": 2.0, "points_failed": 0.0, "runs_logged": 2.0}
    assert parent.info.status == "FINISHED"
    assert {r.data.params["point.top_k"] for r in children} == {"1", "3"}
    for child in children:
        top_k = child.data.params["point.top_k"]
        run_dir = Path(child.data.tags["ragbench.run_dir"])
        assert run_dir.is_relative_to(tmp_path / "sweep") and child.info.status == "FINISHED"
        table = pd.read_parquet(run_dir / "results.parquet")
        rag = table[table["strategy"] == "rag"]
        key = f"rag_k-{top_k}_embedder-hash/string_match_all"  # its label: rag k=1 embedder=hash
        assert child.data.metrics[key] == pytest.approx(rag["string_match_all"].mean())
        rows = client.load_table(experiment.experiment_id, "questions.json", [child.info.run_id])
        assert len(rows) == len(table) == 4 * table["label"].nunique()
        assert set(rows["prediction"]) == set(table["prediction"])
