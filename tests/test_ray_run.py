"""One run sharded over Ray: same records as a local run, kills of a worker and of the driver lose
and duplicate nothing, and the shard planner keeps a corpus' questions on one worker.

One local Ray (num_cpus=2) serves the whole module: starting Ray takes seconds. The fake backend
with ``sleep: true`` takes real time per call, so there is something to kill mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from openai_server import ok, serving
from test_runner import niah_config

from ragbench.experiment.config.run import RunConfig, load_config
from ragbench.experiment.executor_worker import RunWorker
from ragbench.experiment.resources import load_examples
from ragbench.experiment.results import RECORDS, read_records
from ragbench.experiment.runner import plan_rounds, run
from ragbench.experiment.shards import assign, balance, group_key, plan_shards
from ragbench.llm import ServerUnreachable
from ragbench.llm.cache import cache_rows
from ragbench.llm.calibration import describe
from ragbench.llm.cost_model import Rates
from ragbench.secrets import redact_text
from ragbench.types import Document, Example

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

FAKE = {"backend": "fake", "name": "fake", "preset": "smollm2-135m-instruct"}


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module; yields its address (what RAY_ADDRESS names)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


serve = pytest.fixture(serving, name="serve")


def same_fields(record) -> dict:
    """What must not depend on the executor: ids, prediction, scores, tokens, dollars (the
    measured wall times of retrieval, say, do)."""
    cost = record.cost.to_dict() if record.cost is not None else {}
    tokens = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "dollars")
    return {
        "id": (record.example_id, record.strategy, record.params.to_dict()),
        "prediction": record.prediction,
        "scores": record.scores,
        "error": record.error,
        **{k: cost.get(k) for k in tokens},
    }


def keys_in(path: Path) -> list[str]:
    return [json.loads(line)["key"] for line in path.read_bytes().splitlines()]


def slow_config(tmp_path: Path, out: str) -> dict:
    """24 examples, one long_context point each, one example per round; the fake model sleeps
    its simulated prefill (~0.25-0.5 s per round)."""
    cfg = niah_config(tmp_path, strategies=["long_context"], output_dir=str(tmp_path / out))
    cfg["dataset"]["params"]["context_lengths"] = [250, 500]
    cfg["dataset"]["params"]["depth_percents"] = [5, 15, 25, 35, 45, 55, 65, 75, 85, 95, 50, 60]
    cfg["model"] = {**FAKE, "cache": False, "batch_size": 1, "params": {"sleep": True}}
    return cfg


def wait_for_records(out: Path, n: int, alive=lambda: True, timeout: float = 180) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list(out.glob(f"*/{RECORDS}"))
        if found and len(found[0].read_bytes().splitlines()) >= n:
            return found[0]
        assert alive(), "the run ended before it could be killed"
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} records after {timeout} s")


# ---------------------------------------------------------------------------- the planner


def corpus_question(qid: str, corpus: str) -> Example:
    docs = (Document(id=f"{corpus}-d", text=f"the {corpus} corpus"),)
    meta = {"corpus_fingerprint": corpus}
    return Example(id=qid, question=f"q {qid}?", answers=("a",), documents=docs, meta=meta)


def own_doc(qid: str, text: str) -> Example:
    docs = (Document(id="doc", text=text),)
    return Example(id=qid, question=f"q {qid}?", answers=("a",), documents=docs, meta={})


def test_shard_planner_keeps_a_corpus_together():
    a = [corpus_question(f"a{i}", "A") for i in range(5)]
    b = [corpus_question(f"b{i}", "B") for i in range(3)]
    # two questions on one document (same text, no fingerprint), and two documents of their own
    same = [own_doc("s1", "one essay"), own_doc("s2", "one essay")]
    alone = [own_doc("x1", "essay x"), own_doc("x2", "essay y")]
    examples = [
        a[0],
        a[1],
        b[0],
        a[2],
        same[0],
        alone[0],
        b[1],
        a[3],
        same[1],
        alone[1],
        b[2],
        a[4],
    ]
    items = [((e, "point"), f"k{e.id}") for e in examples]
    rounds = plan_rounds(items, 2)  # 6 rounds of 2, corpora interleaved across rounds
    shards = plan_shards([[item for item, _ in r] for r in rounds])

    where: dict[str, set[int]] = {}
    for s, members in enumerate(shards):
        for r in members:
            for (example, _), _ in rounds[r]:
                where.setdefault(group_key(example), set()).add(s)
    assert all(len(found) == 1 for found in where.values())  # every group in one shard
    assert sorted(r for members in shards for r in members) == list(range(len(rounds)))
    assert all(members == sorted(members) for members in shards)  # plan order inside a shard
    assert group_key(same[0]) == group_key(same[1]) != group_key(alone[0])
    assert group_key(a[0]) == group_key(a[4]) != group_key(b[0])
    # deterministic, in plan order
    assert plan_shards([[item for item, _ in r] for r in rounds]) == shards
    assert [members[0] for members in shards] == sorted(members[0] for members in shards)

    # workers get contiguous blocks of about equal items, in plan order
    assert assign([4, 4, 4, 4], 2) == [0, 0, 1, 1]
    assert assign([10, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]
    assert assign([3, 3, 3], 1) == [0, 0, 0]

    # questions on separate documents, one per round: one shard each, nothing to warn about
    apart = [own_doc(f"p{i}", f"essay {i}") for i in range(4)]
    one_each = [[((e, "p"), e.id)] for e in apart]
    assert len(plan_shards([[i for i, _ in r] for r in one_each])) == 4
    assert balance([[0], [1], [2], [3]], one_each, 2) == ""
    assert "1 shard(s) for 2 workers" in balance([[0, 1, 2, 3]], one_each, 2)


# ---------------------------------------------------------------------------- runs on Ray


def test_ray_run_matches_local(tmp_path, local_ray):
    # 4 examples x 5 points, one record per round (a round holds one variant): an example's
    # five rounds are its shard, so 4 shards for 2 workers
    model = {**FAKE, "batch_size": 1}
    ray_cfg = niah_config(tmp_path, model=model, output_dir=str(tmp_path / "ray"))
    df_ray = run(ray_cfg, progress=False, executor="ray", workers=2)
    local_cfg = niah_config(tmp_path, model={**model, "cache": False})
    df_local = run(local_cfg, progress=False)

    ray_dir, local_dir = Path(df_ray.attrs["run_dir"]), Path(df_local.attrs["run_dir"])
    got, want = read_records(ray_dir / RECORDS), read_records(local_dir / RECORDS)
    assert len(want) == 20 and got.keys() == want.keys()
    assert {k: same_fields(r) for k, r in got.items()} == {
        k: same_fields(r) for k, r in want.items()
    }
    assert list(df_ray["example_id"]) == list(df_local["example_id"])  # the same table order
    assert df_ray["error"].isna().all()

    manifest = json.loads((ray_dir / "manifest.json").read_text())
    executor = manifest["sessions"][-1]["executor"]
    assert executor["name"] == "ray" and executor["workers"] == 2
    assert executor["ray_address"] == "local"
    assert len(executor["shards"]) == 4 and {s["worker"] for s in executor["shards"]} == {0, 1}
    assert all(s["hostname"] and s["node_id"] and s["items"] == 5 for s in executor["shards"])
    assert manifest["model"]["backend"] == "fake"
    # the workers' completion caches were merged into the driver's and removed
    cache = Path(os.environ["RAGBENCH_CACHE"])
    assert executor["cache_rows_merged"] > 0
    assert len(cache_rows(cache / "completions.sqlite")) >= executor["cache_rows_merged"]
    assert not list((cache / "workers").glob("*.sqlite"))


def test_bad_executor_is_named(tmp_path):
    with pytest.raises(ValueError, match="unknown executor 'rya'; did you mean 'ray'"):
        run(niah_config(tmp_path), executor="rya")
    with pytest.raises(ValueError, match="workers=2"):
        run(niah_config(tmp_path), workers=2)


def test_worker_killed_mid_run_loses_nothing(tmp_path, local_ray):
    cfg = slow_config(tmp_path, "kill-worker")
    result: dict = {}

    def driver() -> None:
        try:
            result["df"] = run(cfg, progress=False, executor="ray", workers=2)
        except BaseException as exc:  # reported by the assertion below
            result["error"] = exc

    thread = threading.Thread(target=driver)
    thread.start()
    records = wait_for_records(Path(cfg["output_dir"]), 3, alive=thread.is_alive)
    workers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any("RunWorker" in part for part in (p.info["cmdline"] or []))
    ]
    assert workers, "no Ray worker process found"
    os.kill(workers[0].pid, signal.SIGKILL)
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in result, result.get("error")

    keys = keys_in(records)
    assert len(keys) == len(set(keys)) == 24  # none lost, none written twice
    assert result["df"]["error"].isna().all()  # the killed worker's rounds were retried
    # a resume finds nothing to do and writes nothing
    df = run(cfg, progress=False, executor="ray", workers=2)
    assert keys_in(records) == keys and len(df) == 24


def test_driver_killed_then_resumed(tmp_path, local_ray):
    cfg = slow_config(tmp_path, "kill-driver")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [
        sys.executable,
        "-m",
        "ragbench.cli",
        "run",
        str(path),
        "--quiet",
        "--executor",
        "ray",
        "--workers",
        "2",
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "RAY_ADDRESS": local_ray})
    try:
        records = wait_for_records(Path(cfg["output_dir"]), 4, alive=lambda: proc.poll() is None)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before = read_records(records)
    assert 4 <= len(before) < 24

    df = run(path, progress=False, executor="ray", workers=2)
    keys = keys_in(records)
    assert len(keys) == len(set(keys)) == 24 == len(df)  # none lost, none written twice
    assert df["error"].isna().all()
    manifest = json.loads((records.parent / "manifest.json").read_text())
    assert manifest["sessions"][-1]["pending"] == 24 - len(before)  # only the missing ones


def test_a_worker_that_cannot_start_stops_the_run(tmp_path, local_ray):
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = {
        "backend": "openai",
        "name": "m",
        "preset": "smollm2-135m-instruct",
        "cache": False,
        "params": {"base_url": f"http://127.0.0.1:{port}/v1", "tokenizer": "whitespace"},
    }
    cfg = niah_config(tmp_path, model=model, strategies=["closed_book"])
    with pytest.raises(ServerUnreachable, match="cannot connect"):  # the worker's own error
        run(cfg, progress=False, executor="ray", workers=2)
    assert not list(Path(cfg["output_dir"]).glob(f"*/{RECORDS}"))  # before any record


def test_worker_prices_with_the_rates_it_is_given_and_masks_the_configs_secrets(tmp_path):
    """Run in this process (no actor): a worker given worker 0's calibration prices with it, not
    its own, and knows the config's URL password as a secret before anything can fail (the
    backend would remember it, but only once it is built)."""
    rates = Rates(a=0.01, b=0.002, c=1e-7, d0=0.02, d1=1e-8)
    cfg = load_config(niah_config(tmp_path, model={**FAKE, "cache": False}))
    worker = RunWorker(cfg, 1, 2, (load_examples(cfg),), {}, rates)
    assert worker.failure is None
    assert worker.res.rates is rates and worker.ready()["calibration"] == describe(rates)
    assert RunWorker(cfg, 0, 2, (load_examples(cfg),), {}).res.rates is None  # fake: none

    password = "Pw0rd-only-in-this-config-7731"
    url = f"http://user:{password}@127.0.0.1:9/v1"
    model = {
        "backend": "openai",
        "name": "m",
        "preset": "smollm2-135m-instruct",
        "cache": False,
        "params": {"base_url": url, "tokenizer": "whitespace"},
    }
    # validated, not parsed (parse_config would remember it): as a worker receives it, pickled
    cfg = RunConfig.model_validate(niah_config(tmp_path, model=model, strategies=["closed_book"]))
    assert password in redact_text(f"failed: {password}")
    worker = RunWorker(cfg, 0, 1, (None,), {})  # no examples: fails before the model loads
    assert isinstance(worker.failure, TypeError)
    assert password not in redact_text(f"failed: {password}")


def test_each_ray_worker_holds_to_its_share_of_the_rate_limit(tmp_path, serve):
    """Run in this process (no actor) against a loopback server: the configured limit is the
    run's; 3 workers each hold to a third, so together they stay under it."""
    srv = serve(ok())
    model = {
        "backend": "openai",
        "name": "m",
        "preset": "smollm2-135m-instruct",
        "cache": False,
        "params": {"base_url": srv.url, "tokenizer": "whitespace"},
        "rate_limit": {"requests_per_minute": 600, "tokens_per_minute": 90000},
    }
    cfg = load_config(niah_config(tmp_path, model=model, strategies=["closed_book"]))
    worker = RunWorker(cfg, 2, 3, (load_examples(cfg),), {})
    assert worker.failure is None, worker.failure
    limiter = worker.llm.limiter
    assert (limiter.requests_per_minute, limiter.tokens_per_minute) == (200, 30000)
    assert cfg.model.rate_limit.requests_per_minute == 600  # the run's config is unchanged
    one = RunWorker(cfg, 0, 1, (load_examples(cfg),), {}).llm.limiter
    assert (one.requests_per_minute, one.tokens_per_minute) == (600, 90000)


DRIVER = """
import time
import ray
from ragbench.experiment.executor_ray import start_watchdog

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
start_watchdog()

@ray.remote
class Idle:
    def ping(self):
        return 1

actor = Idle.remote()
ray.get(actor.ping.remote())
print("ready", flush=True)
time.sleep(600)
"""


def test_a_local_ray_dies_with_a_driver_killed_by_sigkill(tmp_path):
    """kill -9 of the driver used to leave DashboardAgent, RuntimeEnvAgent and idle workers."""
    import subprocess
    import sys
    import time

    psutil = pytest.importorskip("psutil")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert driver.stdout.readline().strip() == "ready"
        time.sleep(2)  # the watchdog's next look at the driver's descendants
        family = [p for p in psutil.Process(driver.pid).children(recursive=True)]
        names = " ".join(" ".join(p.cmdline()) for p in family if p.is_running())
        assert "raylet" in names, names
        driver.kill()
        driver.wait()
        gone, alive = psutil.wait_procs(family, timeout=60)
        left = [" ".join(p.cmdline())[:120] for p in alive]
        assert len(alive) <= 0, left  # the watchdog ended itself too
    finally:
        if driver.poll() is None:
            driver.kill()
