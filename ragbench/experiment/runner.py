"""Run a config: examples x strategies x parameter points -> results table + manifest.

Run folder: ``<output_dir>/<name>-<config hash[:8]>/`` holding

- ``records.jsonl``: one line per finished Record, appended, flushed and fsynced as each
  chunk of ``model.batch_size`` records completes (``strategies.run_batch``: each round of
  requests goes to the LLM in one call), so a run killed at any moment (SIGKILL included) loses
  at most the chunk in flight; a restart skips the (example, strategy, params) keys already
  there and drops a torn last line. Nothing is ever duplicated: a key is written only if it
  was not loaded.
- ``results.parquet``: the flattened table (``ragbench.experiment.results``), rows in work order and
  columns in a fixed order, both independent of resumes.
- ``manifest.json``: config, hash, dataset fingerprint, model identity, versions, git commit,
  hardware, start and end times (``ragbench.experiment.provenance``).

Judge pass: when the config names judge or embedding metrics (``judge_correct``,
``judge_faithful``, ``semantic_similarity``), every finished record that lacks them is scored
after generation (``ragbench.judge``), through the completion cache, and appended again
(``read_records`` keeps a key's last line). Judge cost lands in the record's ``judge_*`` meta
columns, never in its cost. A judge server that does not answer fails the run before any record
is generated.

Example failures become error rows (``error`` column) and the run continues. Bad input that
makes the whole run meaningless (unknown names, config typos, examples with no gold answers)
fails before any model is loaded, with one clear message.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragbench import secrets
from ragbench.experiment import provenance
from ragbench.experiment.config import RunConfig, config_hash, load_config
from ragbench.experiment.judge_pass import judge_pass, judge_summary, load_judge, needs_judging
from ragbench.experiment.manifest import read_manifest, sessions_of, write_manifest
from ragbench.experiment.results import (
    RECORDS,
    append_record,
    error_record,
    error_summary,
    parquet_bytes,
    read_records,
    table,
    work_key,
)
from ragbench.io import atomic_write_bytes, dumps_canonical
from ragbench.locks import FolderLock
from ragbench.strategies import (
    Resources,
    RetrievalParams,
    StrategyParams,
    get_strategy,
    preload,
    run_batch,
)
from ragbench.types import Example

log = logging.getLogger(__name__)


class DatasetError(ValueError):
    """The dataset cannot be scored (no examples, missing gold answers, duplicate ids)."""


def check_examples(examples: list[Example], dataset: str, generates: bool = True) -> None:
    """A dataset a run can use: some examples, unique ids, and gold answers for at least one
    example when a strategy generates answers (questions without answers are run and reported
    unscored; a retrieval-only run scores against relevance judgements instead)."""
    if not examples:
        raise DatasetError(f"dataset {dataset!r} produced no examples")
    if generates and not any(a.strip() for e in examples for a in e.answers):
        raise DatasetError(
            f"dataset {dataset!r}: none of its {len(examples)} examples has a gold answer; "
            "answer metrics need at least one"
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


def load_examples(config: Any) -> list[Example]:
    """The examples a config (path, dict or RunConfig) runs on, as the run builds them: what
    failure attribution needs beside the table (evidence spans, needles, distractors)."""
    return _load_examples(load_config(config))


def _load_examples(cfg: RunConfig) -> list[Example]:
    from ragbench.datasets import build_dataset

    examples = list(build_dataset(cfg.dataset.name, **cfg.dataset_params()))
    return examples[: cfg.dataset.limit] if cfg.dataset.limit else examples


def _load_llm(cfg: RunConfig):
    return load_model(cfg.model)


def load_model(m: Any):
    """The LLM a ``ModelConfig`` names (the model under test, or a judge), behind the shared
    completion cache when ``m.cache``."""
    from ragbench.llm import load_llm

    cache = None
    if m.cache:
        from ragbench.assets import cache_dir

        cache = cache_dir() / "completions.sqlite"
    if getattr(m, "threads", None):
        from ragbench.llm.hf_load import set_threads

        set_threads(m.threads)
    return load_llm(m.backend, cache=cache, model=m.name, **m.params)


def _chunk_tokenizer(cfg: RunConfig) -> str:
    if cfg.retrieval.tokenizer:
        return cfg.retrieval.tokenizer
    from ragbench.models import PRESETS

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
        # a shared corpus is named by its fingerprint (serialising it per question would cost
        # more than the lookup saves); an example's own documents by their content
        shared = example.meta.get("corpus_fingerprint")
        docs = shared or dumps_canonical([d.to_dict() for d in example.documents])
        key = (str(docs), settings)
        if key not in memo:
            if settings.embedder not in embedders:
                params = cfg.retrieval.embedder_params.get(settings.embedder, {})
                embedders[settings.embedder] = get_embedder(settings.embedder, **params)
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
    from ragbench.cost.prices import price_sheet
    from ragbench.models import get_preset

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


def run(
    config: Any,
    progress: bool = True,
    llm: Any = None,
    wait: bool = False,
    judge_llm: Any = None,
) -> Any:
    """Run ``config`` (path, dict or RunConfig); returns the results DataFrame.

    ``llm`` overrides the configured model (tests, notebooks holding a loaded model), and
    ``judge_llm`` the configured judge model. One process
    writes a run folder at a time: another one on the same folder raises ``LockHeldError``
    naming it, or with ``wait=True`` waits for it to finish. A server that does not answer fails
    here, in seconds, before any record is attempted (``ServerUnreachable``).
    """
    cfg = load_config(config)
    secrets.collect(cfg.model_dump(mode="json"))  # mask them in every error, log and file
    started = _now()
    examples = _load_examples(cfg)
    check_examples(examples, cfg.dataset.name, generates=generates_answers(cfg))
    points = parameter_points(cfg)
    work = [(e, p) for e in examples for p in points]
    keys = [work_key(e.id, p.strategy, p.to_dict()) for e, p in work]
    if len(set(keys)) != len(keys):
        raise ValueError("config lists the same strategy and parameters twice")
    out = run_dir_for(cfg)
    with FolderLock(out, what="run", wait=wait):
        return _run_locked(cfg, examples, work, keys, out, started, progress, llm, judge_llm)


def generates_answers(cfg: RunConfig) -> bool:
    """Whether any strategy of the config calls the model (``retrieve_only`` does not)."""
    return any(get_strategy(s.name).generates for s in cfg.strategies)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def rescore(done: dict[str, Any], examples: list[Example], metrics: list[str]) -> int:
    """Scores of loaded records recomputed from their stored predictions (cheap), so a line
    edited by hand, or written by a version with another metric implementation, cannot keep a
    score its prediction does not earn. Updates ``done`` in place; returns how many changed."""
    import dataclasses

    from ragbench.metrics.answer import score, string_metrics

    gold = {e.id: e.answers for e in examples}
    metas = {e.id: e.meta for e in examples}
    strings = string_metrics(metrics)
    changed = 0
    for key, record in done.items():
        if record.error or record.example_id not in gold:
            continue
        if not get_strategy(record.strategy).generates:  # retrieval scores: nothing to redo
            continue
        answers = gold[record.example_id]
        if not any(a.strip() for a in answers):  # unscored question: nothing to recompute
            continue
        # judge and embedding scores are not recomputable from the prediction alone: kept
        scores = score(record.prediction, answers, metrics, metas[record.example_id])
        stored = {m: record.scores[m] for m in strings if m in record.scores}
        if scores != stored or tuple(answers) != tuple(record.answers):
            changed += scores != stored
            kept = {m: v for m, v in record.scores.items() if m not in strings}
            done[key] = dataclasses.replace(record, scores={**kept, **scores}, answers=answers)
    return changed


def check_server(llm: Any) -> None:
    """One short request to the model's server (backends that have one) before any work: a dead
    server fails the run in seconds with its URL, instead of every record after its retries."""
    check = getattr(llm, "check", None)
    if callable(check):
        check()


def _run_locked(
    cfg, examples, work, keys, out: Path, started: str, progress: bool, llm, judge_llm
) -> Any:
    done = read_records(out / RECORDS)
    changed = rescore(done, examples, list(cfg.metrics))
    if changed:
        log.warning(
            "%s: %d stored score(s) disagreed with their predictions; recomputed",
            out / RECORDS, changed,
        )  # fmt: skip
    # error rows are retried on resume (timeouts, out-of-memory); the new record is appended and
    # read_records keeps the last line of a key
    pending = [(w, k) for w, k in zip(work, keys, strict=True) if k not in done or done[k].error]
    previous = read_manifest(out)
    session: dict[str, Any] = {"started_at": started, "pending": len(pending)}
    sessions = [*sessions_of(previous), session]
    from ragbench.metrics.answer import deferred_metrics

    judging = bool(deferred_metrics(cfg.metrics)) and (
        bool(pending) or any(needs_judging(cfg, done[k]) for k in keys if k in done)
    )
    res = None
    if pending:
        if llm is None and not generates_answers(cfg):
            from ragbench.llm.fake import FakeLLM  # retrieval only: no model is ever called

            llm = FakeLLM(cfg.model.name)
        llm = llm if llm is not None else _load_llm(cfg)  # a CachedLLM has len(): 0 if empty
        check_server(llm)
    # the judge is loaded and its server checked before any record is generated: a dead judge
    # must not be found after an hour of generation
    judge = load_judge(cfg, judge_llm, llm) if judging else None
    if pending:
        identity = provenance.identity(llm) if generates_answers(cfg) else {"retrieval_only": True}
        # written before any work, so a run killed now still knows when it first started
        write_manifest(out, cfg, examples, identity, sessions, status="running", records=None)
        res = _resources(cfg, llm, kv_dtype=identity.get("dtype"))
        res.preload_over.update(preload.count([item for item, _ in pending]))
        if unshared := preload.unshared([item for item, _ in pending]):
            log.warning(
                "%d long_context preload item(s) have no shared corpus (meta corpus_fingerprint: "
                "the corpus or BEIR datasets): nothing is preloaded for them, they run as plain "
                "long_context",
                unshared,
            )
        session["errors"] = _generate(cfg, res, pending, done, out, progress, len(work))
        session["preloaded"] = preload.summary(res)  # one-time costs, apart from the records'
    else:  # nothing to generate: the model is not loaded; its identity is the last run's
        identity = provenance.identity(llm) if llm is not None else (previous or {}).get("model")
        session["errors"] = 0
    if judge is not None:
        session["judged"] = judge_pass(cfg, judge, examples, keys, done, out, progress, llm, res)
    session["finished_at"] = _now()

    meta = {e.id: e.meta for e in examples}
    df = table([done[k] for k in keys], meta, list(cfg.metrics))
    atomic_write_bytes(out / "results.parquet", parquet_bytes(df))
    judge_info = judge_summary(cfg, judge, df, previous)
    manifest = write_manifest(
        out, cfg, examples, identity, sessions, status="finished", records=df, judge=judge_info
    )
    provenance.record_in_notebook(out, manifest)
    failed = int(df["error"].notna().sum())
    if failed:
        top = error_summary(df["error"], limit=1)[0]
        log.warning("%d of %d records failed; most frequent error (%d x): %s",
                    failed, len(df), top[1], top[0])  # fmt: skip
    df.attrs["run_dir"] = str(out)
    if judge_info:
        df.attrs["judge_warnings"] = judge_info["warnings"]
        for message in judge_info["warnings"]:
            log.warning("%s", message)
    return df


def plan_rounds(pending: list, size: int) -> list[list]:
    """The pending items in rounds of at most ``size``, in plan order, balanced: 18 items at
    size 8 run as 6+6+6, not 8+8+2.

    Why balanced: the transformers backend splits a call's device time over its requests in
    proportion to their stand-alone cost, so every record of a round saves by the round's
    batching factor. A record left nearly alone in a last round saved nothing while its run mates
    saved a quarter, and what it was charged depended on where the remainder fell. Why plan order
    (examples x strategy points): each round then mixes the strategies of a few examples, so
    every strategy shares the same factor (a round of only short closed-book prompts would save
    far more than a round of only long contexts), and the questions on one document, listed
    together, keep their shared prefix within a round. Deterministic: depends only on the items."""
    n_rounds = -(-len(pending) // max(1, size))
    base, extra = divmod(len(pending), n_rounds) if n_rounds else (0, 0)
    rounds, start = [], 0
    for r in range(n_rounds):
        end = start + base + (r < extra)
        rounds.append(pending[start:end])
        start = end
    return rounds


def _generate(cfg, res, pending, done, out: Path, progress: bool, total: int) -> int:
    """Generate the pending records in rounds of at most ``batch_size`` (``plan_rounds``),
    appending each round to records.jsonl as it finishes (a killed run loses at most one round).
    Returns the errors."""
    from tqdm import tqdm  # text bar: works in terminals and notebooks without ipywidgets

    errors = 0
    with (out / RECORDS).open("ab") as f:
        # records arrive a whole batch at a time: the rate (and ETA) is the average over the
        # batches finished in this session (smoothing=0), never the burst of one batch's writes
        bar = tqdm(total=total, initial=total - len(pending), desc=cfg.name,
                   disable=not progress, unit="rec", smoothing=0)  # fmt: skip
        # each round's records run together (strategies.run_batch: one LLM call per step)
        for chunk in plan_rounds(pending, cfg.model.batch_size):
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
            bar.update(len(chunk))
        bar.close()
    return errors
