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
is generated; judge calls that fail later leave their records unjudged, and the end of the run
says how many (``judge_pass.unjudged``: one line, also among the manifest's judge warnings). Then the noise pass (``noise_sensitivity``: ``ragbench.experiment.noise_pass``).

Interrupted (Ctrl-C, or SIGTERM, which ``ragbench.io.sigterm_exits`` turns into ``SystemExit``:
every ``ragbench`` command, and the run itself where nothing handles SIGTERM, as in a notebook's
kernel a sweep stops): the records written stay, the completions the interrupted round had finished are in the
completion cache (``model.cache``; the HTTP backend hands them over with the interrupt), the
manifest's status is ``interrupted``, one line says what was kept, and the interrupt goes on
(exit 130 or 143); a rerun resumes and pays for neither.

Example failures become error rows (``error`` column) and the run continues. Bad input that
makes the whole run meaningless (unknown names, config typos, examples with no gold answers,
long-context prompts over the window under the ``error`` overflow policy: ``OverWindowError``,
``ragbench.experiment.preflight``) fails before any model is loaded, with one clear message.

What the run loads (examples, model, index, the strategies' ``Resources``) comes from
``ragbench.experiment.resources``, shared with the judge pass and the dry run; the parameter
points and the price sheet are the validated config's (``cfg.points``, ``cfg.sheet``).

Executors: ``local`` (the default) generates in this process; ``ray`` (``workers=N``) sends the
same rounds to N Ray workers, each with its own model, keeping the questions on one document or
corpus on one worker (``ragbench.experiment.executor_ray``). Either way the records come back
here and this process alone appends them, in the one loop below (``_generate``); the session's
manifest entry says which executor ran, with how many workers, and where each shard ran.

One job: running a config. ``run`` checks it and locks the folder; ``_run_locked`` is the run's
phases in order (prepare, generate, the judge and noise passes, the table, the manifest), each a
function over the ``RunSession``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from tqdm import tqdm  # text bar: works in terminals and notebooks without ipywidgets

from ragbench import secrets
from ragbench.analysis._common import error_summary
from ragbench.assets import cache_dir
from ragbench.experiment import provenance
from ragbench.experiment.budget import Budget
from ragbench.experiment.config.run import RunConfig, config_hash, load_config
from ragbench.experiment.dry_run import RoundCounter
from ragbench.experiment.evidence import write_questions
from ragbench.experiment.executor_ray import RayRun
from ragbench.experiment.judge_pass import (
    judge_pass,
    judge_summary,
    load_judge,
    needs_judging,
    unjudged,
)
from ragbench.experiment.log_once import once_per_run
from ragbench.experiment.manifest import check_schema, read_manifest, sessions_of, write_manifest
from ragbench.experiment.noise_pass import measures_noise, noise_pass
from ragbench.experiment.preflight import check_window
from ragbench.experiment.resources import (
    build_resources,
    check_examples,
    check_metrics,
    check_queries,
    check_server,
    generates_answers,
    load_examples,
    load_model,
)
from ragbench.experiment.results import (
    RECORDS,
    error_record,
    parquet_bytes,
    reprice_resumed,
    table,
    work_key,
)
from ragbench.experiment.sequential_run import Sequential, generate_until_decided
from ragbench.experiment.session import Loaded, RecordWriter, RunSession
from ragbench.io import atomic_write_bytes, dumps_canonical, sigterm_exits
from ragbench.llm.base import LLM
from ragbench.llm.fake import FakeLLM
from ragbench.locks import FolderLock
from ragbench.metrics.answer import deferred_metrics, metric_versions, score, string_metrics
from ragbench.registry import did_you_mean
from ragbench.strategies import get_strategy, preload, run_batch
from ragbench.strategies.base import Resources
from ragbench.strategies.prompt_format import check_cot, prompt_format
from ragbench.types import Example, Record

log = logging.getLogger(__name__)

EXECUTORS = ("local", "ray")  # where generation runs: this process, or Ray workers


def run_dir_for(cfg: RunConfig) -> Path:
    return cfg.output_path() / f"{cfg.name}-{config_hash(cfg)[:8]}"


def run(
    config: str | os.PathLike | RunConfig | dict,
    progress: bool = True,
    llm: LLM | None = None,
    wait: bool = False,
    judge_llm: LLM | None = None,
    executor: str = "local",
    workers: int = 1,
    until_decided: Callable[..., object] | None = None,
) -> pd.DataFrame:
    """Run ``config`` (path, dict or RunConfig); returns the results DataFrame.

    ``llm`` overrides the configured model (tests, notebooks holding a loaded model), and
    ``judge_llm`` the configured judge model. One process
    writes a run folder at a time: another one on the same folder raises ``LockHeldError``
    naming it, or with ``wait=True`` waits for it to finish. A server that does not answer fails
    here, in seconds, before any record is attempted (``ServerUnreachable``); so do long-context
    prompts over the window under the ``error`` overflow policy (``OverWindowError``), before the
    model is loaded. ``executor="ray"`` spreads the generation over ``workers`` Ray workers,
    each loading the configured model (``llm`` cannot travel to them: use the config).
    A config with a ``sequential`` section stops when decided (``experiment.sequential_run``):
    ``until_decided`` is its look, ``analysis.verdict.sequential_look``, handed in by the
    caller (``ragbench run`` and ``compare`` do).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; {did_you_mean(executor, EXECUTORS)}")
    if workers < 1 or (executor == "local" and workers != 1):
        raise ValueError(f"workers={workers}: the local executor runs 1, ray runs 1 or more")
    if executor == "ray" and llm is not None:
        raise ValueError(
            "executor 'ray' loads the configured model on each worker; pass llm= "
            "only with executor 'local'"
        )
    cfg = load_config(config)
    if cfg.sequential is not None and until_decided is None:
        raise ValueError(
            "the config's sequential section needs its look: pass until_decided="
            "ragbench.analysis.verdict.sequential_look (ragbench run does)"
        )
    secrets.collect(cfg.model_dump(mode="json"))  # mask them in every error, log and file
    started = _now()
    examples = load_examples(cfg)
    check_examples(examples, cfg.dataset.name, generates=generates_answers(cfg))
    check_metrics(cfg, examples)  # a metric that could score none of them
    check_queries(cfg, examples)  # a retrieving strategy with nothing to search for
    # chain of thought without a protocol, and long-context prompts over the window under
    # overflow "error", could only fail: stop now, before the model loads (the window counted
    # with its tokenizer alone: OverWindowError)
    check_cot(cfg.points, examples)
    check_window(cfg, examples, llm)
    work = [(e, p) for e in examples for p in cfg.points]
    keys = [work_key(e.id, p.strategy, p.to_dict(), prompt_format(e).name) for e, p in work]
    if len(set(keys)) != len(keys):
        raise ValueError("config lists the same strategy and parameters twice")
    out = run_dir_for(cfg)
    made = [d for d in (out, *out.parents) if not d.exists()]  # the folders the lock creates
    # SIGTERM unwinds (the manifest says interrupted, the lock's owner file goes) where nothing
    # handles it: a notebook's kernel a sweep stops, a script; `ragbench` commands set it already
    with (
        sigterm_exits(replace=False),
        FolderLock(out, what="run", wait=wait) as lock,
        once_per_run(),  # third-party warnings: once
    ):
        try:
            session = RunSession(
                cfg=cfg,
                examples=examples,
                work=work,
                keys=keys,
                out=out,
                writer=RecordWriter(out),
                budget=Budget.of(cfg, examples),
                started=started,
                progress=progress,
                executor=executor,
                workers=workers,
                until_decided=until_decided,
                loaded=Loaded(llm=llm),
            )
            return _run_locked(session, judge_llm)
        except BaseException:
            # refused before writing anything (a backend, pipeline or server check): no folder
            # holding only its lock is left behind, nor the empty output_dir made for it
            if made and lock.discard_if_empty():
                for folder in made[1:]:
                    with contextlib.suppress(OSError):  # not empty: kept, and its parents
                        folder.rmdir()
            raise


def _now() -> str:
    return datetime.now(UTC).isoformat()


def rescore(done: dict[str, Record], examples: list[Example], metrics: list[str]) -> int:
    """Scores of loaded records recomputed from their stored predictions (cheap), so a line
    edited by hand, or written by a version with another metric implementation, cannot keep a
    score its prediction does not earn. Updates ``done`` in place; returns how many changed."""
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


@dataclasses.dataclass
class _RunState:
    """What ``_run_locked``'s phases hand on besides the session: this invocation's pending work
    items, the manifest it resumes (``previous``), its session log (``sessions``; the last one is
    this invocation's ``entry``), the sequential design, and the model identity the manifest
    records (set by the generation phase)."""

    pending: list  # ((example, params), key): the records to generate, in plan order
    previous: dict[str, object] | None  # the folder's manifest before this session (None: new)
    sessions: list[dict[str, object]]  # the manifest's session log, this invocation's entry last
    seq: Sequential | None = None  # questions in rounds until a look decides (sequential_run)
    identity: Any = None  # the model's (provenance.identity), or the last run's

    @property
    def entry(self) -> dict[str, Any]:
        """This invocation's entry in the manifest's session log."""
        return self.sessions[-1]


def _run_locked(session: RunSession, judge_llm: LLM | None) -> pd.DataFrame:
    """The run, its folder locked, in its phases: prepare (rescore, reprice, load the model and
    the judge), generate, the judge and noise passes, close this session's entry, then the table
    and the manifest. ``judge_llm``: the caller's judge model (None: the config's)."""
    state = _prepare(session, judge_llm)
    _generate_pending(session, state)
    _after_generation(session, state)
    passed = _close_entry(session, state)
    df = _write_table(session, state)
    judge_warnings = _write_manifest(session, state, df)
    _tell(session, state, df, passed, judge_warnings)
    return df


def _prepare(session: RunSession, judge_llm: LLM | None) -> _RunState:
    """The folder's records rescored and repriced, the pending work listed, the model loaded and
    its server checked, and the judge loaded: all before any record is generated."""
    cfg, keys, out, done = session.cfg, session.keys, session.out, session.done
    check_schema(out)  # never resumes into a folder another schema wrote
    changed = rescore(done, session.examples, list(cfg.metrics))
    if changed:
        log.warning(
            "%s: %d stored score(s) disagreed with their predictions; recomputed",
            out / RECORDS,
            changed,
        )
    # error rows are retried on resume (timeouts, out-of-memory); the new record is appended and
    # read_records keeps the last line of a key
    pending = [
        (w, k) for w, k in zip(session.work, keys, strict=True) if k not in done or done[k].error
    ]
    previous = read_manifest(out, keep_damaged=True)
    # this invocation's entry in the manifest's session log
    entry: dict[str, object] = {"started_at": session.started, "pending": len(pending)}
    # the sheet file edited since records were priced: reprice them, never mix two versions
    if repriced := reprice_resumed(done, cfg.sheet, out / RECORDS):
        entry["repriced"] = repriced
    sessions = [*sessions_of(previous), entry]
    judging = bool(deferred_metrics(cfg.metrics)) and (
        bool(pending) or any(needs_judging(cfg, done[k]) for k in keys if k in done)
    )
    _load_model(session, pending)
    # the judge is loaded and its server checked before any record is generated: a dead judge
    # must not be found after an hour of generation
    session.loaded.judge = load_judge(cfg, judge_llm, session.loaded.llm) if judging else None
    # sequential: questions in a seeded order, in rounds, until a look decides (sequential_run)
    seq = Sequential(session) if cfg.sequential is not None else None
    return _RunState(pending=pending, previous=previous, sessions=sessions, seq=seq)


def _load_model(session: RunSession, pending: list) -> None:
    """The model under test loaded (none for a Ray run: each worker loads its own and checks its
    server) and each pending point's preflight run; nothing pending, nothing loaded."""
    if not pending:
        return
    points = [p for (_, p), _ in pending]
    if session.executor == "ray":  # each worker loads the model and checks its server
        check_server(None, points)  # each point's preflight
        return
    loaded = session.loaded
    if loaded.llm is None and not generates_answers(session.cfg):  # retrieval only: no model
        loaded.llm = FakeLLM(session.cfg.model.name)
    if loaded.llm is None:  # a CachedLLM has len(): 0 if empty
        loaded.llm = load_model(session.cfg.model)
    check_server(loaded.llm, points)  # and each point's preflight


def _generate_pending(session: RunSession, state: _RunState) -> None:
    """The pending records generated, on Ray workers or here; the model identity set."""
    if not state.pending:  # nothing to generate: the model is not loaded
        _replay(session, state)
        return
    if unshared := preload.unshared([item for item, _ in state.pending]):
        log.warning(
            "%d long_context preload item(s) have no shared corpus (meta corpus_fingerprint: "
            "the corpus or BEIR datasets): nothing is preloaded for them, they run as plain "
            "long_context",
            unshared,
        )
    if session.executor == "ray":
        _generate_ray(session, state)
    else:
        _generate_local(session, state)


def _generate_ray(session: RunSession, state: _RunState) -> None:
    """The pending records generated on the session's Ray workers (``RayRun``)."""
    cfg, pending, entry = session.cfg, state.pending, state.entry
    over = preload.count([item for item, _ in pending])  # the run's, not one worker's
    cache = cache_dir() / "completions.sqlite" if cfg.model.cache else None  # load_model's
    session.budget.bound = RoundCounter(cfg)  # each round counted here, as a dry run counts it
    with RayRun(session, over, main_cache=cache) as pool:
        state.identity = pool.identity
        session.loaded.calibration = pool.calibration  # worker 0's, for the manifest
        write_manifest(session, state.identity, state.sessions, status="running", records=None)
        with _interruptible(session, state.identity, state.sessions):
            entry["errors"] = _generate_all(session, state, pool, pending)
    entry["preloaded"], entry["executor"] = pool.preloaded, pool.summary()


def _generate_local(session: RunSession, state: _RunState) -> None:
    """The pending records generated in this process, over resources built here."""
    cfg, llm, pending, entry = session.cfg, session.loaded.llm, state.pending, state.entry
    identity: dict[str, Any] = (
        provenance.identity(llm) if generates_answers(cfg) else {"retrieval_only": True}
    )
    state.identity = identity
    # written before any work, so a run killed now still knows when it first started
    write_manifest(session, identity, state.sessions, status="running", records=None)
    with _interruptible(session, identity, state.sessions):  # the index is built here: minutes
        res = session.use(
            build_resources(cfg, llm, identity.get("dtype"), unique_examples(pending))
        )
        res.preload_over.update(preload.count([item for item, _ in pending]))
        session.budget.bound = RoundCounter(cfg, res)  # each round's estimate: its own prompts
        entry["errors"] = _generate_all(session, state, _Local(res), pending)
    entry["preloaded"] = preload.summary(res)  # one-time costs, apart from the records'
    entry["executor"] = {"name": "local", "workers": 1}


def _replay(session: RunSession, state: _RunState) -> None:
    """Nothing to generate: the model is not loaded, its identity is the last run's; a
    sequential design replays its looks."""
    llm = session.loaded.llm
    previous = state.previous or {}
    state.identity = provenance.identity(llm) if llm is not None else previous.get("model")
    replays = state.seq is not None
    state.entry["errors"] = _generate_all(session, state, None, []) if replays else 0


def _generate_all(session: RunSession, state: _RunState, executor: Any, items: list) -> int:
    """``items`` generated on ``executor`` (``_generate``), or under a sequential design in
    rounds until a look decides; returns the errors."""
    seq = state.seq
    if seq is None:
        return _generate(session, executor, items)
    scored = deferred_metrics(session.cfg.metrics[:1]) and session.loaded.judge is not None
    errors, handed = generate_until_decided(
        session,
        seq,
        items,
        lambda part: _generate(session, executor, part),
        (lambda: judge_pass(session)) if scored else None,
    )
    state.entry["pending"] = handed  # what this session was to generate; the rest waits
    return errors


def _after_generation(session: RunSession, state: _RunState) -> None:
    """The passes after generation: none once the budget stopped it (a resume does them); each
    may stop at the budget between its chunks."""
    budget, entry = session.budget, state.entry
    with _interruptible(session, state.identity, state.sessions):
        if session.loaded.judge is not None and not budget.stopped:
            entry["judged"] = judge_pass(session)
        if measures_noise(session.cfg) and not budget.stopped:  # noise_sensitivity (noise_pass.py)
            entry["noised"] = noise_pass(session)


def _close_entry(session: RunSession, state: _RunState) -> str | None:
    """This session's entry completed: the budget, the sequential looks, the end time. Returns
    the warning for a spend over the cap that no check stopped (``Budget.passed``)."""
    budget, entry = session.budget, state.entry
    passed = budget.passed(session.done)  # over the cap anyway (never stopped): BUDGET_EXIT
    if budget.stopped:
        entry["stopped"], entry["budget"] = budget.stopped, budget.info
        entry["pending"] -= budget.pending_at_stop  # what it generated; the rest: records_left
    elif passed:
        entry["budget"] = budget.info
    if state.seq is not None:  # every look: n, statistic, boundary, decision; why it stopped
        entry["sequential"] = state.seq.summary()
    entry["finished_at"] = _now()
    return passed


def _rows(session: RunSession) -> list[Record]:
    """The run's records, in work order."""
    return [session.done[k] for k in session.keys if k in session.done]


def _write_table(session: RunSession, state: _RunState) -> pd.DataFrame:
    """results.parquet (one-time costs amortised over the answered) and the questions' texts."""
    cfg, examples, out = session.cfg, session.examples, session.out
    meta = {e.id: e.meta for e in examples}
    rows = _rows(session)
    df = table(rows, meta, list(cfg.metrics))  # one-time costs amortised over the answered
    answered = {key: len(i) for key, i in preload.sharing(rows, meta).items()}
    for pre in state.entry.get("preloaded") or []:  # the manifest says what the table amortised
        pre["amortised_over"] = answered.get((pre["corpus"], pre["overflow"]), 0)
    # the version of each metric the scores were computed with: tables of runs scored before and
    # after a scoring fix cannot be compared (the analysis refuses a metric with two versions)
    df["metric_versions"] = dumps_canonical(metric_versions(cfg.metrics))
    atomic_write_bytes(out / "results.parquet", parquet_bytes(df))
    write_questions(out, examples)  # the view's question texts (experiment.evidence)
    return df


def _write_manifest(session: RunSession, state: _RunState, df: pd.DataFrame) -> list[str] | None:
    """The manifest's last word on this session: its status (stopped, failed or finished), the
    records and the judge's summary. Returns the judge's warnings (None: no judge metric)."""
    cfg, budget = session.cfg, session.budget
    judge_info = judge_summary(cfg, session.loaded.judge, df, state.previous)
    # records the judge left unscored (its calls failed): said once, at the end; a budget stop
    # says its own records left
    if judge_info is not None and not budget.stopped and (line := unjudged(cfg, _rows(session))):
        judge_info["warnings"].insert(0, line)
        df.attrs["unjudged"] = line  # `ragbench run` repeats it after its summary
    failed = _failures(df)  # every record failed: the manifest says failed, not finished
    status = "stopped" if budget.stopped else "failed" if failed else "finished"
    manifest = write_manifest(
        session, state.identity, state.sessions, status=status, records=df, judge=judge_info
    )
    provenance.record_in_notebook(session.out, manifest)
    return judge_info["warnings"] if judge_info else None


def _tell(
    session: RunSession,
    state: _RunState,
    df: pd.DataFrame,
    passed: str | None,
    judge_warnings: list[str] | None,
) -> None:
    """What the caller reads on the table (``df.attrs``) and the warnings said at the end:
    the budget's (``passed``: ``Budget.passed``) and the judge's."""
    budget = session.budget
    df.attrs["run_dir"] = str(session.out)
    if state.seq is not None:  # the verdict reads the run at its last look (analysis.verdict)
        df.attrs["sequential"] = state.entry["sequential"]
    if budget.stopped:
        df.attrs["stopped"] = budget.reason  # `ragbench run` exits BUDGET_EXIT
        log.warning("%s", budget.reason)  # the one line that says why
    elif passed:
        df.attrs["over_budget"] = passed  # `ragbench run` exits BUDGET_EXIT
        log.warning("%s", passed)
    if judge_warnings is not None:
        df.attrs["judge_warnings"] = judge_warnings
        for message in judge_warnings:
            log.warning("%s", message)


def _failures(df: pd.DataFrame) -> bool:
    """Whether every record failed. Then the run did not do what it was asked, and its caller
    says so as an error, in one line naming the most frequent error (``df.attrs["failed"]``:
    ``ragbench run`` and ``compare`` exit 1); some failed: a warning naming it."""
    failed = int(df["error"].notna().sum())
    if not failed:
        return False
    top = error_summary(df["error"], limit=1)[0]
    if failed == len(df):
        df.attrs["failed"] = f"all {failed} records failed; most frequent: {top[1]} x {top[0]}"
        return True
    message = "%d of %d records failed; most frequent error (%d x): %s"
    log.warning(message, failed, len(df), top[1], top[0])
    return False


@contextlib.contextmanager
def _interruptible(
    session: RunSession, identity: Any, sessions: list[dict[str, Any]]
) -> Iterator[None]:
    """An interrupt inside the block (``KeyboardInterrupt``, SIGTERM's ``SystemExit``) marks
    the manifest ``interrupted``, says in one line what was kept, and goes on."""
    written = session.writer.appended
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as stop:
        records = session.writer.appended - written
        sessions[-1]["interrupted_at"] = _now()
        sessions[-1]["records_written"] = records
        cached = getattr(stop, "stored", 0)  # what the completion cache took from the round
        sessions[-1]["completions_cached"] = cached
        write_manifest(session, identity, sessions, status="interrupted", records=None)
        lost = len(getattr(stop, "partial", None) or {}) if not session.cfg.model.cache else 0
        log.warning(
            "interrupted: %d records written, %d finished completions kept in the completion "
            "cache%s; rerun to resume",
            records,
            cached,
            f" ({lost} finished completions not kept: model.cache is off)" if lost else "",
        )
        raise


def unique_examples(pending: list) -> list[Example]:
    """The examples of the pending work items, each once (many points share an example)."""
    seen: dict[str, Example] = {}
    for (example, _), _key in pending:
        seen.setdefault(example.id, example)
    return list(seen.values())


def plan_rounds(
    pending: list, size: int, variant: Callable[[Any], str] | None = None
) -> list[list]:
    """The pending items in rounds of at most ``size``: each strategy variant's items (``variant``
    names an item's; None: all of one) in plan order, cut into balanced rounds (18 items at size
    8 run as 6+6+6, not 8+8+2), the variants' rounds taken in turn.

    Why one variant per round, cut as that variant alone would cut it: a record is priced as if
    its variant ran alone (``cost/alone.py``), and what the transformers backend charges follows
    a call's other requests: the prompt prefix a request reuses from its call mates, and the
    factor by which batching saves every request of the call. So a variant's records have the
    same call mates in a run of one variant or of ten. (Rounds that mixed the strategies of a few
    examples made a question lose the prefix it shared with the question before it whenever
    other variants pushed that one into another round.) Why balanced: a record left nearly
    alone in a last round saved nothing while its run mates saved a quarter. Why in turn: the
    variants advance together, so a run stopped early has every variant's answers to the first
    questions (comparisons pair them). Deterministic: depends only on the items."""
    by_variant: dict[str, list] = {}
    for item in pending:
        by_variant.setdefault(variant(item) if variant else "", []).append(item)
    planned = [balanced(items, size) for items in by_variant.values()]
    longest = max((len(rounds) for rounds in planned), default=0)
    return [rounds[k] for k in range(longest) for rounds in planned if k < len(rounds)]


def balanced(items: list, size: int) -> list[list]:
    """``items`` in order, in the fewest rounds of at most ``size``, as equal as they can be."""
    n_rounds = -(-len(items) // max(1, size))
    base, extra = divmod(len(items), n_rounds) if n_rounds else (0, 0)
    rounds, start = [], 0
    for r in range(n_rounds):
        end = start + base + (r < extra)
        rounds.append(items[start:end])
        start = end
    return rounds


def variant_of(pair: tuple) -> str:
    """The strategy variant (its records' label) of a pending ``((example, params), key)``."""
    return pair[0][1].label()


class _Local:
    """The local executor: each round in this process, in plan order (see ``RayRun`` for Ray)."""

    def __init__(self, res: Resources) -> None:
        self.res = res

    def order(self, rounds: list[list]) -> list[list]:
        return rounds

    def run(self, rounds: Iterable[list]) -> Iterator[tuple[list, list]]:
        for chunk in rounds:  # strategies.run_batch: one LLM call per step
            yield chunk, run_batch([item for item, _ in chunk], self.res)


def _generate(session: RunSession, executor: _Local | RayRun, pending: list) -> int:
    """Generate the session's ``pending`` records in rounds of at most ``batch_size``
    (``plan_rounds``) on ``executor`` (``_Local`` or ``RayRun``), appending each round to
    records.jsonl as it finishes (a killed run loses at most the rounds in flight). Returns the
    errors."""
    cfg, total, errors = session.cfg, len(session.work), 0
    with session.writer.appending() as writer:
        # records arrive a whole batch at a time: the rate (and ETA) is the average over the
        # batches finished in this session (smoothing=0), never the burst of one batch's writes
        bar = tqdm(
            total=total,
            initial=total - len(pending),
            desc=cfg.name,
            disable=not session.progress,
            unit="rec",
            smoothing=0,
        )
        # each round's records run together (strategies.run_batch: one LLM call per step)
        planned = executor.order(plan_rounds(pending, cfg.model.batch_size, variant_of))
        for chunk, outcomes in executor.run(session.budget.rounds(planned, session.done)):
            for ((example, params), key), outcome in zip(chunk, outcomes, strict=True):
                record = (  # one bad example must not stop the run
                    error_record(example, params, outcome)
                    if isinstance(outcome, Exception)
                    else outcome
                )
                errors += record.error is not None
                writer.append(key, record)
            bar.update(len(chunk))
        bar.close()
    return errors
