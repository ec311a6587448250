"""The judge pass: fill the judge and embedding metrics of finished records.

``judge_records`` takes records that lack some of the run's deferred metrics (``metrics.
deferred_metrics``) and returns them with those scores and their judge accounting in ``meta``:

- ``judge_correct`` / ``judge_faithful``: ``samples`` judgements per record, each one request to
  the judge LLM (through whatever wraps it: the runner passes a ``CachedLLM``, so a rerun makes
  no judge calls). A reply that cannot be parsed is asked again with a reminder appended (a
  different prompt, so a greedy or cached judge can answer differently), up to ``max_attempts``;
  a sample still unreadable is ``None`` in ``<metric>_samples``. The score is the mean of the
  readable samples, and ``None`` (NaN in the table) with a ``<metric>_note`` when none was
  readable: an unreadable judge never scores 0. A judge *call* that fails (server error after
  the backend's retries) leaves the metric missing, so a resumed run tries again.
- ``semantic_similarity``: cosine of the prediction's and each gold answer's embedding (the
  same ``embed_documents`` for both: a symmetric comparison), max over the answers, clipped at 0.

Judge cost goes to ``meta`` (``judge_calls``, ``judge_prompt_tokens``, ``judge_completion_tokens``,
``judge_latency_seconds``, ``judge_resource_seconds``, ``judge_dollars``), never into ``Record.cost``: what a strategy costs per query
must not depend on how it was graded.

N different judgements, deterministically: ``samples > 1`` needs ``temperature > 0`` (the config
checks it), and sample k > 0 carries a tag in its system message, so each sample is its own
request: its own completion-cache key, and on the transformers backend its own sampling RNG
(seeded from the request). Served models sample nondeterministically on the first run; the cache
then replays the same N judgements on every rerun. Sample 0 has no tag, so raising ``samples``
keeps the judgements already made.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragbench.cost.accounting import Cost
from ragbench.judge.prompts import JudgePrompt
from ragbench.secrets import redact_text
from ragbench.strategies import get_strategy
from ragbench.strategies.driver import outcomes
from ragbench.types import Completion, Example, GenerationRequest, Record

log = logging.getLogger(__name__)

COST_KEYS = (
    "judge_calls", "judge_prompt_tokens", "judge_cached_prompt_tokens",
    "judge_completion_tokens", "judge_latency_seconds", "judge_resource_seconds", "judge_dollars",
)  # fmt: skip
REPLY_EXCERPT = 120  # characters of an unreadable reply quoted in its note


@dataclass
class Judge:
    """What the judge pass needs; the runner builds it from the config's ``judge`` section."""

    llm: Any = None  # the judge LLM (any backend, usually a CachedLLM); None: no LLM metric
    prompts: dict[str, JudgePrompt] = field(default_factory=dict)  # judge metric -> template
    samples: int = 1
    temperature: float = 0.0
    max_new_tokens: int = 32
    max_attempts: int = 3  # first try + reminders after unreadable replies
    batch_size: int = 8  # judge requests per generate() call
    sheet: Any = None  # PriceSheet of the judge model: judge_dollars
    embedder: Any = None  # semantic_similarity
    model: str = ""  # judge model name, recorded in meta["judge_model"]

    def __post_init__(self) -> None:
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(
                f"judge samples={self.samples} needs temperature > 0: greedy samples of one "
                "prompt are copies and their agreement would mean nothing"
            )

    def request(self, prompt: JudgePrompt, sample: int, attempt: int, **fields: str):
        system = prompt.system
        if sample > 0:  # its own cache key and RNG seed (see the module docstring)
            system += f"\n(Independent judgement {sample + 1}.)"
        return GenerationRequest(
            prompt=prompt.render(attempt, **fields),
            system=system,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            id=f"judge:{prompt.name}:{sample}:{attempt}",
        )


# (example, record) -> the context the model read (None: none); raises to leave it unscored
ContextFn = Callable[[Example, Record], "str | None"]


@dataclass
class _Job:
    """One judge sample of one (record, metric): its attempts so far."""

    item: int
    metric: str
    sample: int
    fields: dict[str, str]
    attempt: int = 0
    verdict: int | None = None
    reply: str = ""
    error: str | None = None
    done: bool = False


def judge_records(
    items: Sequence[tuple[Example, Record]],
    metrics: Sequence[str],
    judge: Judge,
    context_fn: ContextFn | None = None,
) -> list[Record]:
    """``items``' records with the deferred ``metrics`` they lack filled in (see the module
    docstring); records with an error, or already holding every metric, come back unchanged."""
    scores: list[dict[str, Any]] = [dict(r.scores) for _, r in items]
    meta: list[dict[str, Any]] = [dict(r.meta) for _, r in items]
    todo = [[m for m in metrics if m not in r.scores] if r.error is None else [] for _, r in items]
    if "semantic_similarity" in metrics:
        _semantic(items, todo, scores, meta, judge)
    jobs = _jobs(items, todo, scores, meta, judge, context_fn)
    completions: list[list[Completion]] = [[] for _ in items]
    _run_jobs(jobs, judge, completions)
    _collect(jobs, items, scores, meta, judge)
    for i, done in enumerate(completions):
        if done:
            _add_cost(meta[i], done, judge.sheet)
            meta[i]["judge_model"] = judge.model
    return [
        dataclasses.replace(r, scores=scores[i], meta=meta[i])
        if scores[i] != r.scores or meta[i] != r.meta
        else r
        for i, (_, r) in enumerate(items)
    ]


def _has_gold(example: Example) -> bool:
    return any(a.strip() for a in example.answers)


def _semantic(items, todo, scores, meta, judge: Judge) -> None:
    import numpy as np

    wanted = [i for i, t in enumerate(todo) if "semantic_similarity" in t]
    texts: list[str] = []
    spans: dict[int, tuple[int, int]] = {}
    for i in wanted:
        example, record = items[i]
        answers = [a for a in example.answers if a.strip()]
        if not answers:
            scores[i]["semantic_similarity"] = None
            meta[i]["semantic_similarity_note"] = "no gold answers"
        elif not record.prediction.strip():
            scores[i]["semantic_similarity"] = 0.0  # an empty answer resembles no answer
        else:
            spans[i] = (len(texts), len(answers))
            texts += [record.prediction, *answers]
    if not spans:
        return
    if judge.embedder is None:
        raise ValueError("semantic_similarity needs an embedder (Judge.embedder)")
    vectors = judge.embedder.embed_documents(texts)  # L2-normalised: dot = cosine
    for i, (start, n) in spans.items():
        sims = vectors[start + 1 : start + 1 + n] @ vectors[start]
        scores[i]["semantic_similarity"] = float(np.clip(sims.max(), 0.0, 1.0))


def _jobs(items, todo, scores, meta, judge: Judge, context_fn) -> list[_Job]:
    jobs = []
    for i, (example, record) in enumerate(items):
        for metric in (m for m in todo[i] if m in ("judge_correct", "judge_faithful")):
            prompt = judge.prompts[metric]
            fields = {"question": example.question, "prediction": record.prediction}
            reason = None
            if not get_strategy(record.strategy).generates:  # retrieve_only: no answer to judge
                reason = f"{record.strategy} writes no answer"
            elif metric == "judge_correct":
                if _has_gold(example):
                    fields["answers"] = " | ".join(a for a in example.answers if a.strip())
                else:
                    reason = "no gold answers"
            else:
                try:
                    context = context_fn(example, record) if context_fn else None
                except Exception as exc:  # a context that cannot be rebuilt: unscored, said why
                    context, reason = None, f"context unavailable: {exc}"
                if context is None and reason is None:
                    reason = f"{record.strategy} gives the model no context"
                fields["context"] = context or ""
            meta[i][f"{metric}_prompt"] = prompt.name
            if reason is None:
                # a prompt the judge cannot read whole is a fact of this judge, not a retry
                first = judge.request(prompt, 0, 1, **fields)
                need = judge.llm.prompt_tokens(first) + judge.max_new_tokens
                if need > judge.llm.context_window:
                    reason = (
                        f"judge prompt needs {need} tokens; the judge's window is "
                        f"{judge.llm.context_window}"
                    )
            if reason is not None:
                scores[i][metric] = None
                meta[i][f"{metric}_note"] = reason
                continue
            jobs += [_Job(i, metric, k, fields) for k in range(judge.samples)]
    return jobs


def _run_jobs(jobs: list[_Job], judge: Judge, completions: list[list[Completion]]) -> None:
    """Ask, parse, and ask again (with the reminder) until read or out of attempts."""
    while pending := [j for j in jobs if not j.done]:
        for start in range(0, len(pending), judge.batch_size):
            batch = pending[start : start + judge.batch_size]
            for j in batch:
                j.attempt += 1
            requests = [
                judge.request(judge.prompts[j.metric], j.sample, j.attempt, **j.fields)
                for j in batch
            ]
            try:
                results: list[Any] = list(judge.llm.generate(requests))
            except Exception as exc:  # each request's own fate, none sent twice
                results = outcomes(judge.llm, requests, exc)
            for j, out in zip(batch, results, strict=True):
                if isinstance(out, Exception):
                    j.error, j.done = f"{type(out).__name__}: {out}", True
                    continue
                completions[j.item].append(out)
                j.reply = out.text
                j.verdict = judge.prompts[j.metric].parse(out.text)
                j.done = j.verdict is not None or j.attempt >= judge.max_attempts


def _collect(jobs: list[_Job], items, scores, meta, judge: Judge) -> None:
    by_key: dict[tuple[int, str], list[_Job]] = {}
    for j in jobs:
        by_key.setdefault((j.item, j.metric), []).append(j)
    for (i, metric), group in by_key.items():
        group.sort(key=lambda j: j.sample)
        errors = [j.error for j in group if j.error]
        if errors:  # the judge failed (not its reply): leave it missing, a rerun retries it
            meta[i][f"{metric}_note"] = redact_text(f"judge call failed: {errors[0]}")
            log.warning("%s: %s not scored: %s", items[i][1].example_id, metric, errors[0])
            continue
        verdicts = [j.verdict for j in group]
        meta[i][f"{metric}_samples"] = verdicts
        meta[i][f"{metric}_replies"] = [j.reply for j in group]
        read = [v for v in verdicts if v is not None]
        scores[i][metric] = sum(read) / len(read) if read else None
        bad = [j for j in group if j.verdict is None]
        if bad:
            meta[i][f"{metric}_note"] = (
                f"{len(bad)} of {len(group)} judge replies unreadable after {judge.max_attempts} "
                f"attempts; last: {bad[-1].reply[:REPLY_EXCERPT]!r}"
            )
        else:
            meta[i].pop(f"{metric}_note", None)


def _add_cost(meta: dict[str, Any], done: list[Completion], sheet: Any) -> None:
    """Judge accounting, added to what earlier judge passes on this record spent."""
    total = sum((Cost.of(c, None, sheet) for c in done[1:]), Cost.of(done[0], None, sheet))
    new = {
        "judge_calls": total.llm_calls,
        "judge_prompt_tokens": total.prompt_tokens,
        "judge_cached_prompt_tokens": total.cached_prompt_tokens,
        "judge_completion_tokens": total.completion_tokens,
        "judge_latency_seconds": total.latency_seconds,
        "judge_resource_seconds": total.resource_seconds,
        "judge_dollars": total.dollars,
    }
    for key, value in new.items():  # unknown (no price sheet) stays unknown
        meta[key] = None if value is None else value + (meta.get(key) or 0)
