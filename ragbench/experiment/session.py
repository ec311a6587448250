"""One run's session: what the runner's passes share, built once by ``runner.run``.

A ``RunSession`` holds the validated config (immutable), the examples with their work items and
keys, the run folder and its one writer of records (``RecordWriter``), the dollar budget, the
executor and its workers, the progress flag, the session's start time and, for a config with a
``sequential`` section, its look (``until_decided``). Generation (``runner``), the sequential
rounds (``sequential_run``), the judge pass and the noise pass all take it, plus what is their
own; its fields are never rebound.

What a session loads as it goes is ``Loaded`` (``session.loaded``), its one changing part: the
model under test, the judge, the strategies' ``Resources`` and the calibration they priced with
(the manifest's ``calibration``; a Ray run's is worker 0's). A session with nothing to generate
loads the model only when a pass needs it (``RunSession.resources``), and then once for all the
passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ragbench.experiment import provenance
from ragbench.experiment.budget import Budget
from ragbench.experiment.config.run import RunConfig
from ragbench.experiment.evidence import ChunkJournal
from ragbench.experiment.resources import build_resources, load_model
from ragbench.experiment.results import RECORDS, append_record, read_records
from ragbench.judge.calls import Judge
from ragbench.llm.base import LLM
from ragbench.llm.calibration import describe
from ragbench.strategies.base import Resources
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.rag import CHUNK_TEXTS
from ragbench.types import Example, Record

WorkItem = tuple[Example, StrategyParams]  # one record to make: an example at a parameter point


class RecordWriter:
    """The run folder's one writer of ``records.jsonl`` (the runner holds the folder's lock) and
    the records the folder holds, by key (``done``: a key's last line, ``read_records``).
    ``append`` writes a record (flushed and fsynced) and holds it, inside ``appending()``."""

    def __init__(self, out: Path) -> None:
        self.path = out / RECORDS
        self.done: dict[str, Record] = read_records(self.path)
        self.chunks = ChunkJournal(out)  # the texts of the chunks records point to
        self._file: BinaryIO | None = None
        self._chunk_file: BinaryIO | None = None
        self.appended = 0  # records appended by this writer (this session)

    @contextlib.contextmanager
    def appending(self) -> Iterator[RecordWriter]:
        """The files open for appending while the block runs."""
        with self.path.open("ab") as f, self.chunks.path.open("ab") as chunks:
            self._file, self._chunk_file = f, chunks
            try:
                yield self
            finally:
                self._file = self._chunk_file = None

    def append(self, key: str, record: Record) -> None:
        """``record`` appended; the texts of its chunks first (``experiment.evidence``), so a
        record line never points to a chunk the folder lacks."""
        if self._file is None:
            raise RuntimeError("RecordWriter.append outside appending()")
        if CHUNK_TEXTS in record.meta:
            meta = self.chunks.take(record.meta, self._chunk_file)
            record = dataclasses.replace(record, meta=meta)
        append_record(self._file, key, record)
        self.done[key] = record
        self.appended += 1


@dataclass
class Loaded:
    """What a session has loaded so far (None: not yet, or never: a Ray run's models live on its
    workers)."""

    llm: LLM | None = None  # the model under test (a CachedLLM when the config caches)
    judge: Judge | None = None  # the judge metrics' judge (runner: before any record)
    res: Resources | None = None  # what the strategies read besides the example
    # the calibration that priced the records (``llm.calibration.describe``), for the manifest
    calibration: dict[str, object] | None = None


@dataclass(frozen=True)
class RunSession:
    """One invocation of a run (module docstring). ``work[i]`` is keyed ``keys[i]``."""

    cfg: RunConfig  # validated once; never written
    examples: list[Example]
    work: list[WorkItem]  # examples x parameter points, in plan order
    keys: list[str]  # each work item's record key (``results.work_key``)
    out: Path  # the run folder (locked by the runner)
    writer: RecordWriter
    budget: Budget  # max_dollars: where the passes stop
    started: str  # this session's start (ISO, UTC)
    progress: bool = True  # progress bars
    executor: str = "local"  # local | ray
    workers: int = 1  # Ray workers (1 for local)
    # a sequential config's look (analysis.verdict.sequential_look, handed down by the caller)
    until_decided: Callable[..., object] | None = None
    loaded: Loaded = field(default_factory=Loaded)

    @property
    def done(self) -> dict[str, Record]:
        """The run's records so far, by key (the writer's)."""
        return self.writer.done

    def use(self, res: Resources) -> Resources:
        """``res`` as the session's resources; its calibration is the one the manifest records."""
        self.loaded.res, self.loaded.calibration = res, describe(res.rates)
        return res

    def resources(self) -> Resources:
        """The strategies' resources: those generation built, else built now (the model under
        test loaded first when the session has none), once for every pass that needs them."""
        if self.loaded.res is None:
            if self.loaded.llm is None:
                self.loaded.llm = load_model(self.cfg.model)
            llm = self.loaded.llm
            self.use(build_resources(self.cfg, llm, kv_dtype=provenance.identity(llm).get("dtype")))
        assert self.loaded.res is not None
        return self.loaded.res
