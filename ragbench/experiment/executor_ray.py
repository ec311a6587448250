"""One run's pending work spread over Ray workers (``ragbench run --executor ray --workers N``).

The runner plans its rounds as for a local run (same batches, hence the same records); this
module groups them into shards (``shards.plan_shards``: questions on one document or one shared
corpus stay on one worker, so prefix reuse survives), starts N ``executor_worker.RunWorker``
actors (each its own model: one GPU each when the cluster has GPUs and the backend loads
weights, else CPU threads split; or each a client of the same server), gives each worker a
contiguous block of shards (``shards.assign``) and sends each worker its rounds in plan order,
at most two queued per worker (``order``, ``run``). Records come back to
the driver, which alone appends them to the run folder as they arrive (one writer; the runner's
append loop, shared with the local executor and its budget check), so a killed driver or worker
loses at most the rounds in flight, and a resume reruns only what is missing. A ``max_dollars``
budget checks before each round is sent; the rounds already queued (two per worker) are priced
only as they finish, so a Ray run can pass its cap by up to those.

Cost: a backend that loads weights prices a record by its calibration (``cost_basis:
calibrated``), measured per node; worker 0 starts first and the others price with its rates, so
a record's dollars do not depend on the worker that ran it (nor on a calibration measured while
N workers load at once).

Failures: a worker process that dies is restarted by Ray (``max_restarts``) and its in-flight
rounds retried (``max_task_retries``); once its restarts are spent, each round it still had
becomes error records (``WorkerDied``), which a resume retries. A worker that cannot start (a dead
server, a missing model) stops the run before any record, with the original error.

Ray: ``RAY_ADDRESS`` set joins that cluster; else a local Ray starts (``num_cpus``: the
machine's cores, at least the workers; no dashboard, quiet logs) and is shut down at the end.
A local Ray dies with its driver: Ray ends its raylet and GCS with the process that started
them, but a driver killed outright (``kill -9``, out of memory) used to leave the dashboard
agent, the runtime-env agent and idle workers running. A watchdog process (``start_watchdog``,
its own session, deaf to Ctrl-C) notes the driver's descendants every second and, once the
driver is gone, ends those still running (SIGTERM, then SIGKILL after 3 s; psutil checks each
process's start time, so a reused PID is never hit). A clean end stops the watchdog first. A
Ray already initialised in this process (a notebook, the tests) is used as it is. The examples
travel once through Ray's object store; paths a worker opens itself (a model folder, a pipeline
module beside the config) must exist on every node. The judge pass stays on the driver.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from ragbench.experiment.executor_worker import RunWorker, WorkerInfo
from ragbench.experiment.results import error_record
from ragbench.experiment.session import RunSession
from ragbench.experiment.shards import assign, balance, plan_shards
from ragbench.llm import backend_capabilities
from ragbench.llm.cache import merge_rows
from ragbench.llm.cost_model import Rates
from ragbench.secrets import redact_text
from ragbench.types import Example

log = logging.getLogger(__name__)

# The watchdog (a separate interpreter; psutil, which Ray requires, and nothing of ragbench):
# argv[1] is the driver's PID. It ends on its own when the driver ends cleanly (stopped first).
WATCHDOG = """
import os, signal, sys, time
import psutil
signal.signal(signal.SIGINT, signal.SIG_IGN)
driver, me, seen = psutil.Process(int(sys.argv[1])), os.getpid(), {}
while True:
    try:
        if not driver.is_running() or driver.status() == psutil.STATUS_ZOMBIE:
            break
        for p in driver.children(recursive=True):
            if p.pid != me:
                seen[p.pid] = p
    except psutil.NoSuchProcess:
        break
    time.sleep(1.0)
alive = []
for p in seen.values():
    try:
        if p.is_running():
            p.terminate()
            alive.append(p)
    except psutil.Error:
        pass
gone, left = psutil.wait_procs(alive, timeout=3)
for p in left:
    try:
        p.kill()
    except psutil.Error:
        pass
"""


def start_watchdog(pid: int | None = None) -> subprocess.Popen:
    """The process that ends a local Ray's processes when the driver ``pid`` (this process)
    dies without shutting Ray down (see the module docstring). Stop it (``terminate``) before a
    clean shutdown."""
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(pid or os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the terminal's Ctrl-C and hangups do not reach it
    )


RESTARTS = 2  # per worker: a process killed twice is restarted twice, then its rounds fail
IN_FLIGHT = 2  # rounds queued per worker: the next one is there when a round finishes


class WorkerDied(RuntimeError):
    """A worker's process died more often than Ray restarts it; its round was not run."""


def _ray() -> ModuleType:
    try:
        import ray  # heavy (seconds): only a Ray run imports it
    except ImportError:
        raise ValueError("executor 'ray' needs Ray: pip install 'ray>=2.9'") from None
    return ray


class RayRun:
    """``with RayRun(session, preload_over) as pool: pool.run(pool.order(rounds))``.

    Entering starts (or joins) Ray and the session's workers (``RunSession.workers``), and waits
    until every worker has loaded its model; ``identity`` and ``calibration`` are then worker
    0's. Leaving ends the workers, merges their completion caches into ``main_cache`` (when
    given) and shuts down a Ray it started."""

    def __init__(
        self,
        session: RunSession,
        preload_over: dict[tuple, int],
        main_cache: str | os.PathLike | None = None,
    ) -> None:
        self.cfg, self.workers = session.cfg, session.workers
        self.examples: list[Example] = list(session.examples)
        self.preload_over, self.main_cache = preload_over, main_cache
        self.identity: dict[str, Any] = {}
        self.calibration: dict[str, object] | None = None  # worker 0's (for the manifest)
        self.actors: list[Any] = []
        self.started_here = False
        self.watchdog: subprocess.Popen | None = None
        self.shards: list[dict[str, Any]] = []  # per shard: worker, rounds, items, where it ran
        self.infos: list[WorkerInfo] = []
        self.preloaded: list[dict[str, object]] = []
        self.merged = 0  # cache rows the workers added to main_cache

    # ------------------------------------------------------------------ start and stop

    def __enter__(self) -> RayRun:
        ray = _ray()
        address = os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
            if address:
                ray.init(address=address, **quiet)
            else:
                cpus = max(self.workers, os.cpu_count() or 1)
                ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
                self.watchdog = start_watchdog()  # a kill -9 of this process ends Ray too
            self.started_here = True
        self.address = redact_text(address) if address else "local"
        t0 = time.perf_counter()
        try:
            self._start_workers(ray)
            self.start_seconds = time.perf_counter() - t0  # processes, imports, model loads
        except BaseException:
            self._stop(ray)
            raise
        return self

    def _start_workers(self, ray: ModuleType) -> None:
        gpus = ray.cluster_resources().get("GPU", 0)
        local_weights = backend_capabilities(self.cfg.model.backend).local_weights
        # one GPU per worker that loads weights; fewer GPUs than workers: they share them
        self.gpus = min(1.0, gpus / self.workers) if gpus and local_weights else 0
        actor = ray.remote(RunWorker).options(
            num_cpus=1, num_gpus=self.gpus, max_restarts=RESTARTS, max_task_retries=RESTARTS
        )
        # once through the object store, not per round; held here, so a restarted worker (its
        # __init__ run again) still finds them
        self._examples_ref = ray.put(self.examples)

        def start(indices: range, rates: Rates | None = None) -> list[WorkerInfo]:
            # the examples wrapped: a bare reference would be a constructor argument Ray cannot
            # restart from
            ref = (self._examples_ref,)
            new = [
                actor.remote(self.cfg, i, self.workers, ref, self.preload_over, rates)
                for i in indices
            ]
            self.actors += new
            try:
                return ray.get([a.ready.remote() for a in new])
            except ray.exceptions.RayTaskError as exc:  # the worker's error: ServerUnreachable...
                cause = getattr(exc, "cause", None)
                raise (
                    cause if isinstance(cause, Exception) else exc.as_instanceof_cause()
                ) from None

        # a model that loads weights is priced by its calibration (measured on first load): worker
        # 0 measures it alone, and the others price with its rates, so a record's dollars do not
        # depend on which worker (or node) ran it
        first = 1 if local_weights else self.workers
        self.infos = start(range(first))
        self.infos += start(range(first, self.workers), self.infos[0]["rates"])
        self.identity = self.infos[0]["identity"]
        self.calibration = self.infos[0]["calibration"]  # for the manifest, as locally

    def __exit__(self, *exc_info: object) -> None:
        ray = _ray()
        try:
            if exc_info[0] is None and self.actors:
                self._finish(ray)
        finally:
            self._stop(ray)

    def _stop(self, ray: ModuleType) -> None:
        """End the workers, and a Ray this run started."""
        try:
            for a in self.actors:
                ray.kill(a, no_restart=True)
        finally:
            self.actors = []
            if self.watchdog is not None:  # a clean end: nothing for it to do
                self.watchdog.terminate()
                self.watchdog.wait()
                self.watchdog = None
            if self.started_here:
                ray.shutdown()
                self.started_here = False

    def _finish(self, ray: ModuleType) -> None:
        """Preload summaries, and the workers' cache rows merged into the driver's cache (a
        worker that is gone keeps its file for the next run of the config to merge)."""
        merged = 0
        for a in self.actors:
            try:
                out = ray.get(a.finish.remote())
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                log.warning("a Ray worker did not report its cache and preloads: %s", exc)
                continue
            self.preloaded.extend(out["preloaded"])
            if self.main_cache is not None and out["cache_rows"]:
                try:
                    merged += merge_rows(self.main_cache, out["cache_rows"])
                except Exception as exc:  # a cache must not fail a finished run
                    log.warning("could not merge a worker's completion cache: %s", exc)
                    continue
            ray.get(a.drop_cache.remote())
        self.merged = merged

    # ------------------------------------------------------------------ the work

    def order(self, chunks: list[list]) -> list[list]:
        """The rounds (``((example, params), key)`` pairs each, as the runner planned them) in
        the order they will be sent: each worker a contiguous block of shards of about equal
        items (``shards.assign``), its rounds in plan order, the workers' lists interleaved by
        progress so all of them advance together. The runner's budget check
        (``Budget.rounds``) sees them in this order, one before each is sent."""
        items = [[item for item, _ in c] for c in chunks]
        shards = plan_shards(items)
        if note := balance(shards, items, self.workers):
            log.warning("%s", note)
        sizes = [sum(len(chunks[r]) for r in members) for members in shards]
        lists: list[list[int]] = [[] for _ in range(self.workers)]
        self._worker_of: dict[int, tuple[int, int]] = {}  # id(chunk) -> (worker, shard)
        for s, (members, w) in enumerate(zip(shards, assign(sizes, self.workers), strict=True)):
            lists[w].extend(members)
            self.shards.append({"shard": s, "worker": w, "rounds": len(members), "items": sizes[s]})
            for r in members:
                self._worker_of[id(chunks[r])] = (w, s)
        slots = [
            ((j + 0.5) / len(rounds), w, r)
            for w, rounds in enumerate(lists)
            for j, r in enumerate(rounds)
        ]
        return [chunks[r] for _, _, r in sorted(slots)]

    def run(self, chunks: Iterable[list]) -> Iterator[tuple[list, list]]:
        """``(chunk, records)`` for the rounds ``chunks`` yields (``order``'s, possibly cut
        short by the budget), in the order they finish; at most ``IN_FLIGHT`` rounds are queued
        per worker, so a round is sent only when its worker is nearly free."""
        ray = _ray()
        ex_index = {id(e): i for i, e in enumerate(self.examples)}
        pt_index = {id(p): i for i, p in enumerate(self.cfg.points)}
        rows = {row["shard"]: row for row in self.shards}
        inflight: dict[Any, tuple[int, int, list]] = {}  # ref -> (worker, shard, chunk)

        def one_result() -> tuple[list, list]:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            w, s, chunk = inflight.pop(ready[0])
            try:
                records, where = ray.get(ready[0])
                rows[s].update({k: where.get(k) for k in ("node_id", "hostname", "pid")})
            except ray.exceptions.RayActorError as exc:  # restarts spent: reported, not lost
                died = WorkerDied(f"Ray worker {w} died ({type(exc).__name__}); rerun to retry")
                records = [error_record(e, p, died) for (e, p), _ in chunk]
            except ray.exceptions.RayTaskError as exc:  # the round itself raised (not an item)
                cause = exc.as_instanceof_cause()
                records = [error_record(e, p, cause) for (e, p), _ in chunk]
            return chunk, records

        for chunk in chunks:
            w, s = self._worker_of[id(chunk)]
            while sum(1 for v in inflight.values() if v[0] == w) >= IN_FLIGHT:
                yield one_result()
            encoded = [(ex_index[id(e)], pt_index[id(p)]) for (e, p), _ in chunk]
            inflight[self.actors[w].run_round.remote(encoded)] = (w, s, chunk)
        while inflight:
            yield one_result()

    def summary(self) -> dict[str, object]:
        """The manifest's account of this session's executor: workers, where each ran, shards."""
        return {
            "name": "ray",
            "workers": self.workers,
            "ray_address": self.address,
            "gpus_per_worker": self.gpus,
            "start_seconds": round(self.start_seconds, 3),  # until every worker had its model
            "worker_hosts": [
                {k: info.get(k) for k in ("worker", "node_id", "hostname", "pid")}
                for info in self.infos
            ],
            "shards": sorted(self.shards, key=lambda row: row["shard"]),
            "cache_rows_merged": self.merged,
        }
