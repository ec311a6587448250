"""Sweeps as processes: one execution per point across concurrent sweeps (point locks), and no
worker or kernel left running when a sweep is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from ragbench.locks import FolderLock
from ragbench.workspace.sweep.run import execute_sweep
from ragbench.workspace.sweep.spec import point_id

PROBE = Path(__file__).parent / "fixtures" / "notebooks" / "sweep_probe.ipynb"
KEY = "qz-sweep-credential-51f0c9"  # no well-known key shape: only its name and value give it away
# a sweep in its own process, as a user starts it; prints its outcome as one JSON line
SWEEP = """
import faulthandler, json, signal, sys
from dataclasses import asdict
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where a hang is
# a terminal's sweep, where Ctrl-C works: a test suite started as a background job (`make test &`,
# nohup) has SIGINT ignored, inherited here, and the sweep rightly keeps an ignored signal ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
from ragbench.workspace.sweep.run import execute_sweep
outcome = execute_sweep(sys.argv[1], workers=int(sys.argv[2]))
print("OUTCOME " + json.dumps([asdict(p) for p in outcome.points]))
"""


def write_spec(folder: Path, **spec) -> Path:
    spec.setdefault("notebook", str(PROBE))
    spec.setdefault("output_dir", str(folder / "out"))
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def start_sweep(spec: Path, workers: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SWEEP, str(spec), str(workers)],
        cwd=spec.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcome_of(proc: subprocess.Popen, timeout: float = 240) -> list[dict]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("OUTCOME ")]
    return json.loads(line.removeprefix("OUTCOME "))


def executions(log: Path) -> list[int]:
    """The x of each execution the notebooks logged, sorted."""
    if not log.exists():
        return []
    return sorted(int(line.split()[0]) for line in log.read_text().splitlines())


# --- point locks ----------------------------------------------------------------------------------


def test_two_concurrent_sweeps_execute_each_point_once(tmp_path):
    # both start together and reach point 1 at once, and each point takes seconds (a kernel
    # start, a sleep): the second sweep finds points in progress (no done.json yet). Before
    # point locks, both sweeps executed every point
    log = tmp_path / "executions.log"
    spec = write_spec(
        tmp_path, parameters={"sleep_s": 1.0, "log_path": str(log)}, grid={"x": [1, 2, 3]}
    )
    sweeps = [start_sweep(spec), start_sweep(spec)]
    outcomes = [outcome_of(p) for p in sweeps]

    assert executions(log) == [1, 2, 3]
    for points in outcomes:  # each sweep waited for the other's points: it reports all three
        assert [(p["params"]["x"], p["status"]) for p in points] == [
            (1, "done"),
            (2, "done"),
            (3, "done"),
        ]
        assert all(p["seconds"] > 1.0 and p["finished_at"] for p in points)
    ran = sorted(p["params"]["x"] for points in outcomes for p in points if not p["skipped"])
    assert ran == [1, 2, 3]  # each point executed by exactly one of them, and reported so
    by_point = [{p["point_id"]: p for p in points} for points in outcomes]
    for pid, mine in by_point[0].items():  # the sweep that did not run a point reports its run
        theirs = by_point[1][pid]
        assert (mine["seconds"], mine["finished_at"]) == (theirs["seconds"], theirs["finished_at"])


def test_a_point_held_by_a_live_process_is_passed_by_and_a_dead_ones_lock_taken_over(
    tmp_path, caplog
):
    log = tmp_path / "executions.log"
    spec = write_spec(tmp_path, parameters={"log_path": str(log)}, grid={"x": [1, 2]})
    out = tmp_path / "out"
    held, stale = (out / point_id({"log_path": str(log), "x": x}, ["x"]) for x in (1, 2))
    # x=2: a sweep that died mid-point left its owner file; the OS released its lock
    stale.mkdir(parents=True)
    dead = {"pid": 999_999_999, "host": "gone", "started": "2025-01-01T00:00:00+00:00"}
    (stale / ".lock.owner").write_text(json.dumps(dead))
    with FolderLock(held, what="sweep point"):  # x=1: this (live) process executes it
        outcome = execute_sweep(spec, wait=False)

    (one, two) = outcome.points
    assert (one.status, two.status) == ("held", "done")
    assert one.holder.startswith(f"PID {os.getpid()} on ") and "running elsewhere" in one.note()
    assert not two.skipped and executions(log) == [2]  # only the point nobody held ran
    assert outcome.failed == [] and not (held / "failed.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert [p["status"] for p in summary] == ["held", "done"]
    assert "taking over the lock of PID 999999999 on gone" in caplog.text
    assert not (stale / ".lock.owner").exists()  # released on a clean exit

    # released: a resumed sweep runs the point that was held, and only that one
    again = execute_sweep(spec, wait=False)
    assert [(p.status, p.skipped) for p in again.points] == [("done", False), ("done", True)]
    assert executions(log) == [1, 2]


def test_a_failure_recorded_by_another_sweep_meanwhile_is_not_executed_again(tmp_path):
    # sweep A plans point p (rerun_failed: a failed point runs again); before A gets p's lock,
    # sweep B executes p and it fails. A must report B's failure, not execute p a second time.
    from ragbench.workspace.sweep.point import FAILED, mtime_ns, recorded

    point = tmp_path / "p"
    point.mkdir()
    job = {"point_dir": str(point), "output_notebook": str(point / "nb.ipynb")}
    marker = point / FAILED

    def fail(seconds: float) -> None:
        marker.write_text(json.dumps({"status": "failed", "seconds": seconds, "error": "E: x"}))
        os.utime(marker, ns=(time.time_ns(), time.time_ns() + int(seconds * 1e9)))

    assert recorded({**job, "failed_seen": None}, accept_failed=False) is None  # nothing yet
    fail(1.0)  # an old failure, there when A planned: rerun it
    assert recorded({**job, "failed_seen": mtime_ns(marker)}, accept_failed=False) is None
    seen = mtime_ns(marker)
    fail(2.0)  # B's failure, recorded after A planned
    result = recorded({**job, "failed_seen": seen}, accept_failed=False)
    assert result["status"] == "failed" and result["skipped"] and result["seconds"] == 2.0
    assert recorded({**job, "failed_seen": None}, accept_failed=False)["seconds"] == 2.0
    assert recorded(job, accept_failed=True)["error"] == "E: x"  # --no-rerun-failed
    assert recorded(job, accept_failed=False) is None  # the sweep's first look: rerun it


# --- stopping a sweep -----------------------------------------------------------------------------


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running; a zombie counts as gone (this machine's init may never reap it)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize(
    "how",
    [
        "SIGTERM",
        pytest.param("SIGINT", marks=pytest.mark.slow),  # Ctrl-C: the same path as SIGTERM
        pytest.param("SIGKILL", marks=pytest.mark.slow),  # workers end by PR_SET_PDEATHSIG
    ],
)
def test_stopping_a_sweep_leaves_no_worker_or_kernel_behind(tmp_path, how):
    log = tmp_path / "executions.log"
    spec = write_spec(
        tmp_path,
        parameters={"sleep_s": 300.0, "log_path": str(log), "api_key": KEY},
        grid={"x": [1, 2]},
    )
    # output to files, not pipes: a surviving worker would hold a pipe open and hang the test
    with open(tmp_path / "sweep.log", "w") as out:
        sweep = subprocess.Popen(
            [sys.executable, "-c", SWEEP, str(spec), "2"], cwd=tmp_path, stdout=out, stderr=out
        )
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(executions(log)) < 2:  # both points inside their sleep: 2 workers, 2 kernels
            assert sweep.poll() is None, (tmp_path / "sweep.log").read_text()
            assert time.monotonic() < deadline, "the sweep never got both points running"
            time.sleep(0.2)
        descendants = psutil.Process(sweep.pid).children(recursive=True)
        kernels = [p for p in descendants if "ipykernel" in " ".join(p.cmdline())]
        assert len(kernels) == 2 and len(descendants) >= 4

        sweep.send_signal(getattr(signal, how))
        try:
            sweep.wait(timeout=30)
        except subprocess.TimeoutExpired:  # seen once in a full local run: say where it hung
            sweep.send_signal(signal.SIGUSR1)
            time.sleep(2)
            pytest.fail(
                f"sweep still running 30 s after {how}; its threads and log:\n"
                + (tmp_path / "sweep.log").read_text()[-6000:]
            )
        deadline = time.monotonic() + 15  # SIGTERM, then a 3 s grace before SIGKILL
        while _alive(descendants) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [(p.pid, " ".join(p.cmdline())[:80]) for p in _alive(descendants)]
        assert survivors == [], f"left running after {how}: {survivors}"
    finally:  # whatever happened, this test leaves nothing of its own running
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        for proc in _alive(descendants):
            proc.kill()
    if how == "SIGTERM":
        assert sweep.returncode == 128 + signal.SIGTERM  # the shell's convention
    assert sweep.returncode != 0
    # a stop the sweep can catch is recorded on the way out: neither point finished, so the
    # summary lists none (SIGKILL leaves no way out)
    summary = tmp_path / "out" / "summary.json"
    if how != "SIGKILL":
        assert json.loads(summary.read_text(encoding="utf-8")) == []
    points = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert len(points) == 2
    for point in points:  # interrupted is neither done nor failed
        assert not (point / "done.json").exists() and not (point / "failed.json").exists()
        assert list(point.glob("*.ipynb")), "papermill saves the notebook while it runs"
        for path in point.iterdir():  # ... and that save holds no credential
            assert KEY not in path.read_text(encoding="utf-8", errors="replace"), path


# a point whose notebook runs an experiment (FakeLLM) that waits in its first answer
RUN_CELL = """import time
from pathlib import Path
from ragbench.experiment.runner import run
from ragbench.llm.fake import FakeLLM


def slow(request):
    Path(run_out, f"started{x}").touch()
    time.sleep(120)
    return "7463343"


needle = {"context_lengths": [300], "depth_percents": [10, 90], "answer": "7463343",
          "needle": "The special magic number is 7463343.", "question": "The number?",
          "tokenizer": "whitespace"}
cfg = {"name": "p", "dataset": {"name": "niah", "params": needle},
       "model": {"backend": "fake", "name": "fake", "cache": False, "batch_size": 1},
       "strategies": ["closed_book"], "metrics": ["contains"], "output_dir": f"{run_out}/{x}"}
run(cfg, progress=False, llm=FakeLLM(answer_fn=slow))
"""


def test_sigterm_stops_a_sweep_and_the_runs_in_its_kernels_as_it_stops_run(tmp_path):
    """Issue 45: SIGTERM to `ragbench sweep` killed the kernels' runs where they stood (manifest
    running, a lock owner left) and left each point's lock owner behind (the pool worker ends
    with os._exit). Now each run is interrupted as under `ragbench run`, no owner file is left
    anywhere, one line says how to resume, and the sweep exits 143."""
    import nbformat

    params = 'x: int = 1  # grid\nrun_out: str = ""  # the runs\noutput_dir: str = ""  # point'
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell(RUN_CELL),
        ],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(notebook, str(tmp_path / "point.ipynb"))
    runs = tmp_path / "runs"
    runs.mkdir()
    spec = write_spec(
        tmp_path,
        notebook=str(tmp_path / "point.ipynb"),
        parameters={"run_out": str(runs)},
        grid={"x": [1, 2]},
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "sweep.log", "w") as log:  # files, not pipes: nothing can hang on them
        sweep = subprocess.Popen(
            [sys.executable, "-m", "ragbench.cli", "sweep", str(spec), "--workers", "2"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=log,
        )
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not all((runs / f"started{x}").exists() for x in (1, 2)):
            assert sweep.poll() is None, (tmp_path / "sweep.log").read_text()
            assert time.monotonic() < deadline, "the points' runs never started"
            time.sleep(0.2)
        descendants = psutil.Process(sweep.pid).children(recursive=True)
        sweep.send_signal(signal.SIGTERM)
        sweep.wait(timeout=60)
        deadline = time.monotonic() + 15
        while _alive(descendants) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(descendants) == []
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for proc in _alive(descendants):
            proc.kill()
    log = (tmp_path / "sweep.log").read_text()
    assert sweep.returncode == 143, log
    assert (
        "interrupted by SIGTERM: the finished points are kept (summary.json); run the same " in log
    )
    manifests = sorted(runs.glob("*/*/manifest.json"))
    assert len(manifests) == 2
    assert [json.loads(m.read_text())["status"] for m in manifests] == ["interrupted"] * 2
    assert sorted(p.name for p in tmp_path.rglob(".lock.owner")) == []  # runs' and points'
    assert list(tmp_path.rglob("*.tmp")) == []
