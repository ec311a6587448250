"""The run's judge pass (``ragbench.experiment.runner`` calls it after generation): load the
judge its config names, score the deferred metrics (judge, embedding) of finished records that
lack them, append the updated records, and summarise the judge for the manifest. Models and the
strategies' resources are loaded as the run loads them (``ragbench.experiment.resources``)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tqdm import tqdm

from ragbench import secrets
from ragbench.experiment import provenance
from ragbench.experiment.config.run import RunConfig
from ragbench.experiment.config.sections import JudgeConfig, one_or_list
from ragbench.experiment.resources import check_server, load_model
from ragbench.experiment.session import RunSession
from ragbench.judge import Judge, judge_agreement, judge_records, judge_warnings
from ragbench.judge.metric import get_judge_metric
from ragbench.metrics.answer import METRICS, deferred_metrics
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.strategies import Contexts, contexts_of
from ragbench.strategies.base import Resources
from ragbench.types import Example, Record

if TYPE_CHECKING:
    import pandas as pd


def needs_judging(cfg: RunConfig, record: Record) -> bool:
    deferred = deferred_metrics(cfg.metrics)
    return record.error is None and any(m not in record.scores for m in deferred)


def unjudged(cfg: RunConfig, records: list[Record]) -> str | None:
    """The end-of-run line for the finished ``records`` the judge left without a deferred
    metric (a judge call that failed after its retries: ``<metric>_note``), with the most
    frequent reason; None when every one was judged. A rerun retries them."""
    missed = [r for r in records if needs_judging(cfg, r)]
    if not missed:
        return None
    failed = "judge call failed: "
    reasons: Counter[str] = Counter()
    for record in missed:
        for metric in deferred_metrics(cfg.metrics):
            if metric not in record.scores:
                note = str(record.meta.get(f"{metric}_note") or "no score")
                reasons[f"{metric}: {note.removeprefix(failed)}"] += 1
                break  # one reason per record
    why, count = reasons.most_common(1)[0]
    judgeable = sum(1 for r in records if r.error is None)
    return (
        f"{len(missed)} of {judgeable} records not judged (most frequent ({count} x): {why}); "
        "rerun to retry"
    )


JUDGE_CHUNK = 32  # records judged (and appended) together: a killed judge pass loses one chunk


def load_judge(cfg: RunConfig, judge_llm: object, llm: object) -> Judge:
    """The ``ragbench.judge.Judge`` of the config, its LLM loaded and its server checked."""
    jc = cfg.judge or JudgeConfig()
    llm_metrics = [m for m in cfg.metrics if METRICS.get(m).kind == "judge"]
    m = jc.model
    if llm_metrics and judge_llm is None:
        same = m is not None and (m.backend, m.name, m.params) == (
            cfg.model.backend,
            cfg.model.name,
            cfg.model.params,
        )
        if same and llm is not None:  # allowed by the config (checked there): one model in memory
            judge_llm = llm
        else:
            assert m is not None  # RunConfig: judge metrics need judge.model
            judge_llm = load_model(m)
    if llm_metrics:
        check_server(judge_llm)
    embedder = None
    if any(_embeds(metric) for metric in deferred_metrics(cfg.metrics)):
        embedder = get_embedder(jc.embedder or one_or_list(cfg.retrieval.embedder)[0])
    return Judge(
        llm=judge_llm if llm_metrics else None,
        prompts={metric: jc.prompt(metric) for metric in llm_metrics},
        samples=jc.repeats,
        temperature=jc.temperature,
        max_new_tokens=m.max_new_tokens if m is not None else 32,
        max_attempts=jc.max_attempts,
        batch_size=m.batch_size if m is not None else 8,
        sheet=jc.sheet,  # loaded by the config's validation
        embedder=embedder,
        model=(m.name if m is not None else getattr(judge_llm, "name", "")) if llm_metrics else "",
        questions=jc.questions,
    )


def _embeds(metric: str) -> bool:
    """Whether the judge metric reads the judge's embedder (an embedding metric, or one that
    says it needs one)."""
    judged = get_judge_metric(metric)
    return judged.needs_embedder or not judged.asks_llm


def judge_pass(session: RunSession) -> int:
    """Score the deferred metrics of every finished record of the session that lacks them with
    its judge (``session.loaded.judge``), appending each updated record; returns how many
    records were updated. The session's budget (``experiment.budget.Budget``) may stop it
    between chunks (``max_dollars``)."""
    cfg, done, budget, judge = session.cfg, session.done, session.budget, session.loaded.judge
    todo = [k for k in session.keys if k in done and needs_judging(cfg, done[k])]
    if not todo:
        return 0
    assert judge is not None  # the runner calls the judge pass with its judge loaded
    by_id = {e.id: e for e in session.examples}

    def resources() -> Resources:
        # the model under test's tokenizer and the index rebuild the prompt's context; a run
        # with nothing left to generate loads the model only if a record needs it
        return session.resources()

    def read(example: Example, record: Record) -> Contexts:
        return contexts_of(record, example, resources)  # rebuilt only when a metric asks

    metrics = deferred_metrics(cfg.metrics)
    updated = 0
    with session.writer.appending() as writer:
        bar = tqdm(
            total=len(todo), desc=f"{cfg.name} judge", disable=not session.progress, unit="rec"
        )
        start = 0
        while start < len(todo):
            # under a cap, a first chunk of one record when the judge's price is not known yet
            part = todo[start : start + budget.judge_chunk(done, JUDGE_CHUNK, first=start == 0)]
            chunk = [done[k] for k in part]
            if not budget.allows(done, chunk, len(todo) - start, "judge"):
                break
            start += len(part)
            items = [(by_id[done[k].example_id], done[k]) for k in part]
            for key, record in zip(part, judge_records(items, metrics, judge, read), strict=True):
                if record is not done[key]:
                    writer.append(key, record)
                    updated += 1
                bar.update(1)
        bar.close()
    return updated


def judge_summary(
    cfg: RunConfig, judge: Judge | None, df: pd.DataFrame, previous: dict | None
) -> dict | None:
    """The manifest's ``judge`` entry: the judge, its prompts and how far to trust it."""
    if not deferred_metrics(cfg.metrics):
        return None
    agreement = judge_agreement(df)
    rows = [
        {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
        for row in agreement.to_dict("records")
    ]  # NaN is not JSON
    if judge is not None and judge.llm is not None:
        model = secrets.redact(provenance.identity(judge.llm))
    else:
        model = ((previous or {}).get("judge") or {}).get("model")
    return {
        "model": model,
        "prompts": {m: p.name for m, p in judge.prompts.items()} if judge else None,
        "repeats": cfg.judge.repeats if cfg.judge else 1,
        "samples": cfg.judge.repeats if cfg.judge else 1,  # its older name, for older readers
        "agreement": rows,
        "warnings": judge_warnings(df, agreement),
    }
