"""Run a config: examples x strategies x parameter points -> results table + manifest.

Run folder: ``<output_dir>/<name>-<config hash[:8]>/`` holding

- ``records.jsonl``: one line per finished Record, appended, flushed and fsynced as each
  chunk of ``model.batch_size`` records completes (``strategies.run_batch``: each round of
  requests goes to the LLM in one call), so a run killed at any moment (SIGKILL included) loses
  at most the chunk in flight; a restart skips the (example, strategy, params) keys already
  there and drops a torn last line. Nothing is ever duplicated: a key is written only if it
  was not loaded.
- ``results.parquet``: the flattened table (``ragbench.results``), rows in work order and
  columns in a fixed order, both independent of resumes.
- ``manifest.json``: config, hash, dataset fingerprint, model identity, versions, git commit,
  hardware, start and end times (``ragbench.provenance``).

Example failures become error rows (``error`` column) and the run continues. Bad input that
makes the whole run meaningless (unknown names, config typos, examples with no gold answers)
fails before any model is loaded, with one clear message.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragbench import provenance
from ragbench.config import RunConfig, config_hash, load_config
from ragbench.io import atomic_write_bytes, atomic_write_text, dumps_canonical
from ragbench.locks import FolderLock
from ragbench.results import (
    RECORDS,
    append_record,
    error_record,
    parquet_bytes,
    read_records,
    table,
    work_key,
)
from ragbench.strategies import Resources, RetrievalParams, StrategyParams, get_strategy, run_batch
from ragbench.types import Example

log = logging.getLogger(__name__)


class DatasetError(ValueError):
    """The dataset cannot be scored (no examples, missing gold answers, duplicate ids)."""


def check_examples(examples: list[Example], dataset: str) -> None:
    if not examples:
        raise DatasetError(f"dataset {dataset!r} produced no examples")
    no_answers = [e.id for e in examples if not any(a.strip() for a in e.answers)]
    if no_answers:
        raise DatasetError(
            f"dataset {dataset!r}: {len(no_answers)} of {len(examples)} examples have no gold "
            f"answers (first: {no_answers[0]!r}); answer metrics need at least one per example"
        )
    seen: set[str] = set()
    for e in examples:
        if e.id in seen:
            raise DatasetError(f"dataset {dataset!r}: duplicate example id {e.id!r}")
        seen.add(e.id)


def parameter_points(cfg: RunConfig) -> list[StrategyParams]:
    """Every (strategy, parameter point) of the config, in config order: each strategy's
    ``params`` grid, crossed with the ``retrieval`` grid for the strategies that retrieve."""
    retrieval = cfg.retrieval.grid_values()
    return [p for s in cfg.strategies for p in get_strategy(s.name).grid(s.params, retrieval)]


# ---------------------------------------------------------------------------- resources


def _load_examples(cfg: RunConfig) -> list[Example]:
    from ragbench.datasets import build_dataset

    examples = list(build_dataset(cfg.dataset.name, **dict(cfg.dataset.params)))
    return examples[: cfg.dataset.limit] if cfg.dataset.limit else examples


def _load_llm(cfg: RunConfig):
    from ragbench.llm import load_llm

    m = cfg.model
    cache = None
    if m.cache:
        from ragbench.assets import cache_dir

        cache = cache_dir() / "completions.sqlite"
    return load_llm(m.backend, cache=cache, model=m.name, **m.params)


def _chunk_tokenizer(cfg: RunConfig) -> str:
    if cfg.retrieval.tokenizer:
        return cfg.retrieval.tokenizer
    from ragbench.llm.presets import PRESETS

    name = cfg.model.name
    embedded = name in PRESETS and PRESETS[name].embedded
    return name if cfg.model.backend == "hf" and embedded else "whitespace"


def make_index(cfg: RunConfig, cache_size: int = 8):
    """(example, retrieval settings) -> (chunks, retriever), memoised by documents and settings
    (many questions share one corpus); each embedder is loaded once per run."""
    from ragbench.retrieval import build_index
    from ragbench.retrieval.embedders import get_embedder

    tokenizer = _chunk_tokenizer(cfg)
    embedders: dict[str, Any] = {}
    memo: OrderedDict[tuple[str, RetrievalParams], tuple] = OrderedDict()

    def index(example: Example, settings: RetrievalParams):
        key = (dumps_canonical([d.to_dict() for d in example.documents]), settings)
        if key not in memo:
            if settings.embedder not in embedders:
                embedders[settings.embedder] = get_embedder(settings.embedder)
            memo[key] = build_index(
                example.documents,
                retriever=settings.retriever,
                embedder=embedders[settings.embedder],
                splitter=settings.splitter,
                chunk_size=settings.chunk_size,
                chunk_overlap=settings.chunk_overlap,
                tokenizer=tokenizer,
                retriever_params=cfg.retrieval.params_for(settings.retriever),
            )
            if len(memo) > cache_size:
                memo.popitem(last=False)
        memo.move_to_end(key)
        return memo[key]

    return index


def _resources(cfg: RunConfig, llm, kv_dtype: str | None = None) -> Resources:
    from ragbench.llm.presets import get_preset
    from ragbench.prices import price_sheet

    needs_index = any(get_strategy(s.name).needs_retrieval for s in cfg.strategies)
    return Resources(
        llm=llm,
        metrics=tuple(cfg.metrics),
        max_new_tokens=cfg.model.max_new_tokens,
        prompt_budget=cfg.prompt_budget,
        preset=get_preset(cfg.model.arch) if cfg.model.arch else None,
        kv_dtype=kv_dtype,  # transformers backend: the model's dtype (identity()["dtype"])
        sheet=price_sheet(cfg.price_sheet) if cfg.price_sheet else None,
        index=make_index(cfg) if needs_index else None,
    )


# ---------------------------------------------------------------------------- run


def run_dir_for(cfg: RunConfig) -> Path:
    return Path(cfg.output_dir) / f"{cfg.name}-{config_hash(cfg)[:8]}"


def run(config: Any, progress: bool = True, llm: Any = None, wait: bool = False) -> Any:
    """Run ``config`` (path, dict or RunConfig); returns the results DataFrame.

    ``llm`` overrides the configured model (tests, notebooks holding a loaded model). One process
    writes a run folder at a time: another one on the same folder raises ``LockHeldError``
    naming it, or with ``wait=True`` waits for it to finish.
    """
    cfg = load_config(config)
    started = datetime.now(UTC).isoformat()
    examples = _load_examples(cfg)
    check_examples(examples, cfg.dataset.name)
    points = parameter_points(cfg)
    work = [(e, p) for e in examples for p in points]
    keys = [work_key(e.id, p.strategy, p.to_dict()) for e, p in work]
    if len(set(keys)) != len(keys):
        raise ValueError("config lists the same strategy and parameters twice")
    out = run_dir_for(cfg)
    with FolderLock(out, what="run", wait=wait):
        return _run_locked(cfg, examples, work, keys, out, started, progress, llm)


def _run_locked(cfg, examples, work, keys, out: Path, started: str, progress: bool, llm) -> Any:
    from tqdm import tqdm  # text bar: works in terminals and notebooks without ipywidgets

    from ragbench.datasets.formats import fingerprint

    done = read_records(out / RECORDS)
    # error rows are retried on resume (timeouts, out-of-memory); the new record is appended and
    # read_records keeps the last line of a key
    pending = [(w, k) for w, k in zip(work, keys, strict=True) if k not in done or done[k].error]

    llm = llm or _load_llm(cfg)
    identity = provenance.identity(llm)
    res = _resources(cfg, llm, kv_dtype=identity.get("dtype"))
    errors = 0
    with (out / RECORDS).open("ab") as f:
        bar = tqdm(total=len(work), initial=len(work) - len(pending), desc=cfg.name,
                   disable=not progress, unit="rec")  # fmt: skip
        # chunks of batch_size records run together (strategies.run_batch: one LLM call per
        # round); records are appended per chunk, so a killed run loses at most one chunk
        size = cfg.model.batch_size
        for start in range(0, len(pending), size):
            chunk = pending[start : start + size]
            outcomes = run_batch([item for item, _ in chunk], res)
            for ((example, params), key), outcome in zip(chunk, outcomes, strict=True):
                record = (  # one bad example must not stop the run
                    error_record(example, params, outcome)
                    if isinstance(outcome, Exception)
                    else outcome
                )
                errors += record.error is not None
                append_record(f, key, record)
                done[key] = record
                bar.update(1)
        bar.close()

    meta = {e.id: e.meta for e in examples}
    df = table([done[k] for k in keys], meta, list(cfg.metrics))
    atomic_write_bytes(out / "results.parquet", parquet_bytes(df))
    manifest = {
        "name": cfg.name,
        "config": cfg.model_dump(mode="json"),
        "config_hash": config_hash(cfg),
        "dataset": {
            "name": cfg.dataset.name,
            "fingerprint": fingerprint(examples),
            "n": len(examples),
        },
        "model": identity,
        "records": len(df),
        "errors": int(df["error"].notna().sum()),
        "resumed_records": len(work) - len(pending),
        "versions": provenance.versions(),
        "git_commit": provenance.git_commit(),
        "hardware": provenance.hardware(),
        "started_at": started,
        "finished_at": datetime.now(UTC).isoformat(),
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    provenance.record_in_notebook(out, manifest)
    if errors:
        first = next(r.error for r in done.values() if r.error)
        log.warning("%d of %d records failed; first error: %s", errors, len(pending), first)
    df.attrs["run_dir"] = str(out)
    return df
