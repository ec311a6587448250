"""One worker of a run sharded over Ray (``executor_ray``): a Ray actor holding its own model,
its own completion cache file and the strategies' resources, answering rounds of work items.

It loads the configured model as a local run does (``resources.load_model``: one GPU when Ray
gave it one, else ``model.threads`` or the node's cores split between the run's workers), wraps
it in a completion cache of its own (``<cache dir>/workers/completions-<config hash>-w<i>.sqlite``
on its node: one sqlite file per worker, never one file over a network filesystem), checks the
model's server and builds the resources. It never writes the run folder: each round's records go
back to the driver, which appends them. At the end the driver takes the cache's rows, merges them
into its own completion cache and has the worker delete its file (a worker whose driver died
keeps its file, and the next run of the config merges it).

A failure while starting (a dead server, a missing model) is kept and raised by every call, so
the driver sees the original error (``RayTaskError.as_instanceof_cause``) and stops the run
before any record. Ray restarts a worker whose process dies (``__init__`` runs again) and retries
the rounds it had in flight.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ragbench import secrets
from ragbench.assets import cache_dir
from ragbench.experiment import provenance
from ragbench.experiment.config.run import RunConfig, config_hash
from ragbench.experiment.resources import build_resources, check_server, generates_answers
from ragbench.experiment.resources import load_model as load_configured_model
from ragbench.experiment.results import error_record
from ragbench.llm import backend_capabilities
from ragbench.llm.cache import CachedLLM, cache_rows
from ragbench.llm.calibration import describe
from ragbench.llm.cost_model import Rates
from ragbench.llm.fake import FakeLLM
from ragbench.strategies import preload, run_batch
from ragbench.strategies.pipeline.target import imports_from
from ragbench.types import Example, Record


def worker_cache_path(cfg: RunConfig, index: int) -> Path:
    """Worker ``index``'s completion cache on its own node."""
    return cache_dir() / "workers" / f"completions-{config_hash(cfg)[:8]}-w{index}.sqlite"


class Where(TypedDict):
    """Where a worker runs, for the manifest: its index, host, process and Ray node."""

    worker: int
    hostname: str
    pid: int
    node_id: NotRequired[str | None]


class WorkerInfo(Where):
    """``RunWorker.ready()``: where it runs, its model's identity and what prices its records."""

    identity: dict[str, Any]
    calibration: dict[str, object] | None
    rates: Rates | None


class WorkerFinish(TypedDict):
    """``RunWorker.finish()``: its preloads (for the manifest) and its completion cache's rows."""

    preloaded: list[dict[str, object]]
    cache_rows: list[tuple]


class RunWorker:
    """A Ray actor (``ray.remote(RunWorker)``): see the module docstring. ``examples`` and
    ``preload_over`` (questions per preload group, counted over the whole run) come from the
    driver (the examples as a 1-tuple holding their object reference); rounds name items by
    (example index, point index). ``rates``: worker 0's calibration (``ready()["rates"]``), which
    the others price with instead of their own (one node's measurement, not one per worker)."""

    def __init__(
        self,
        cfg: RunConfig,
        index: int,
        workers: int,
        examples: tuple[object],
        preload_over: dict[tuple, int],
        rates: Rates | None = None,
    ) -> None:
        self.cfg, self.index = cfg, index
        # as the driver does (runner.run): the config's keys and URL passwords are masked in this
        # process's error records and logs too, not only those the driver's environment names
        secrets.collect(cfg.model_dump(mode="json"))
        self.points = cfg.points
        self.failure: Exception | None = None
        self.where: Where = {"worker": index, "hostname": socket.gethostname(), "pid": os.getpid()}
        try:
            self.where["node_id"] = _node_id()
            self.examples: list[Example] = _fetch(examples[0])
            self._start(workers, preload_over, rates)
        except Exception as exc:  # raised by every call: the driver reports the original error
            self.failure = exc

    def _start(self, workers: int, preload_over: dict[tuple, int], rates: Rates | None) -> None:
        cfg = self.cfg
        if generates_answers(cfg):
            # the node's cores split between the run's workers (a backend that loads weights),
            # unless the config says
            split = max(1, (os.cpu_count() or 1) // max(1, workers))
            local = backend_capabilities(cfg.model.backend).local_weights
            threads = cfg.model.threads or (split if local else None)
            update: dict[str, Any] = {"cache": False, "threads": threads}
            if cfg.model.rate_limit is not None:  # the run's limit, split between its workers
                update["rate_limit"] = cfg.model.rate_limit.share(max(1, workers))
            model = cfg.model.model_copy(update=update)
            llm = load_configured_model(model)
            if cfg.model.cache:
                llm = CachedLLM(llm, worker_cache_path(cfg, self.index))
            check_server(llm)
            identity = provenance.identity(llm)
        else:  # retrieval only: no model is ever called (as in a local run)
            llm, identity = FakeLLM(cfg.model.name), {"retrieval_only": True}
        self.llm = llm
        self.res = build_resources(cfg, llm, identity.get("dtype"), self.examples)
        self.res.preload_over.update(preload_over)
        if rates is not None:  # worker 0's: a record's dollars do not depend on its worker
            self.res.rates = rates
        calibration = describe(self.res.rates)  # what priced its records (the manifest's)
        self.info: WorkerInfo = {
            **self.where,
            "identity": identity,
            "calibration": calibration,
            "rates": self.res.rates,
        }

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def ready(self) -> WorkerInfo:
        """Where the worker runs and its model's identity (for the manifest)."""
        self._check()
        return self.info

    def run_round(self, items: list[tuple[int, int]]) -> tuple[list[Record], Where]:
        """One round (``strategies.run_batch``: one LLM call per step), as records in order (an
        item that failed is an error record), and where it ran."""
        self._check()
        batch = [(self.examples[e], self.points[p]) for e, p in items]
        with imports_from(*([self.cfg._source_dir] if self.cfg._source_dir else [])):
            outcomes = run_batch(batch, self.res)  # a pipeline target may sit beside the config
        records = [
            error_record(example, params, out) if isinstance(out, Exception) else out
            for (example, params), out in zip(batch, outcomes, strict=True)
        ]
        return records, self.where

    def finish(self) -> WorkerFinish:
        """The worker's preloads (for the manifest) and its completion cache's rows."""
        self._check()
        rows: list[tuple] = []
        if isinstance(self.llm, CachedLLM):
            self.llm.close()
            rows = cache_rows(self.llm.path)
        return {"preloaded": preload.summary(self.res), "cache_rows": rows}

    def drop_cache(self) -> None:
        """Delete the cache file once the driver has merged its rows."""
        llm = getattr(self, "llm", None)  # none when the worker failed to start
        if isinstance(llm, CachedLLM):
            for suffix in ("", "-wal", "-shm", ".open.lock"):
                Path(f"{llm.path}{suffix}").unlink(missing_ok=True)


def _node_id() -> str | None:
    """The Ray node this process runs on (None outside a Ray worker)."""
    import ray  # heavy, and only ever imported inside a Ray worker here

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _fetch(examples: Any) -> list[Example]:
    """The run's examples: a Ray object reference (the driver holds it, so a restarted worker
    finds it again), or the list itself."""
    import ray  # heavy, and only ever imported inside a Ray worker here

    return ray.get(examples) if isinstance(examples, ray.ObjectRef) else list(examples)
