"""The judge pass: fill the judge and embedding metrics of finished records.

``judge_records`` takes records that lack some of the run's deferred metrics (``metrics.
deferred_metrics``) and returns them with those scores and their judge accounting in ``meta``:

- ``judge_correct`` / ``judge_faithful``: ``samples`` judgements per record (the config's
  ``judge.repeats``), each one request to the judge LLM (through whatever wraps it: the runner
  passes a ``CachedLLM``, so a rerun makes no judge calls). A reply that cannot be parsed is asked again with a reminder appended (a
  different prompt, so a greedy or cached judge can answer differently), up to ``max_attempts``;
  a sample still unreadable is ``None`` in ``<metric>_samples``. The score is the mean of the
  readable samples, and ``None`` (NaN in the table) with a ``<metric>_note`` when none was
  readable: an unreadable judge never scores 0. With more than one sample, ``<metric>_spread``
  is the readable samples' standard deviation (``calls.keep_repeats``). A judge *call* that fails (server error after
  the backend's retries) leaves the metric missing, so a resumed run tries again.
- ``semantic_similarity``: cosine of the prediction's and each gold answer's embedding (the
  same ``embed_documents`` for both: a symmetric comparison), max over the answers, clipped at 0.

Judge cost goes to ``meta`` (``judge_calls``, ``judge_prompt_tokens``, ``judge_completion_tokens``,
``judge_latency_seconds``, ``judge_resource_seconds``, ``judge_dollars``), never into ``Record.cost``: what a strategy costs per query
must not depend on how it was graded.

The context metrics (``context_precision``, ``context_recall``, ``answer_relevancy``) are
judged in the same pass, their calls batched, cached and costed with these (``context_metrics``);
the calls themselves, the ``Judge`` and the ``samples`` convention are ``calls``'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ragbench.judge.calls import Job, Judge, add_cost, keep_repeats, run_jobs, settled
from ragbench.judge.context_metrics import ContextsFn, collect_context_jobs, context_jobs
from ragbench.strategies import get_strategy
from ragbench.types import Completion, Example, Record

# (example, record) -> the context the model read (None: none); raises to leave it unscored
ContextFn = Callable[[Example, Record], "str | None"]


def judge_records(
    items: Sequence[tuple[Example, Record]],
    metrics: Sequence[str],
    judge: Judge,
    context_fn: ContextFn | None = None,
    contexts_fn: ContextsFn | None = None,
) -> list[Record]:
    """``items``' records with the deferred ``metrics`` they lack filled in (see the module
    docstring); records with an error, or already holding every metric, come back unchanged."""
    scores: list[dict[str, Any]] = [dict(r.scores) for _, r in items]
    meta: list[dict[str, Any]] = [dict(r.meta) for _, r in items]
    todo = [[m for m in metrics if m not in r.scores] if r.error is None else [] for _, r in items]
    if "semantic_similarity" in metrics:
        _semantic(items, todo, scores, meta, judge)
    jobs = _jobs(items, todo, scores, meta, judge, context_fn)
    more = context_jobs(items, todo, scores, meta, judge, contexts_fn)
    completions: list[list[Completion]] = [[] for _ in items]
    run_jobs(jobs + more, judge, completions)
    _collect(jobs, items, scores, meta, judge)
    collect_context_jobs(more, items, scores, meta, judge)
    for i, done in enumerate(completions):
        if done:
            add_cost(meta[i], done, judge.sheet)
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


def _jobs(items, todo, scores, meta, judge: Judge, context_fn) -> list[Job]:
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
            if reason is None:  # a prompt the judge cannot read whole: unscored, not retried
                reason = judge.too_long(judge.request(prompt, 0, 1, **fields))
            if reason is not None:
                scores[i][metric] = None
                meta[i][f"{metric}_note"] = reason
                continue
            jobs += [Job(i, metric, k, fields) for k in range(judge.samples)]
    return jobs


def _collect(jobs: list[Job], items, scores, meta, judge: Judge) -> None:
    for i, metric, group in settled(jobs, items, meta, judge):
        group.sort(key=lambda j: j.sample)
        verdicts = [j.verdict for j in group]
        keep_repeats(metric, verdicts, scores[i], meta[i])
        meta[i][f"{metric}_replies"] = [j.reply for j in group]
