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

Each metric is one class (``metric.JudgeMetric``, registered in ``metric.JUDGE_METRICS``) that
says what it needs, what it asks and how it scores; this pass only asks the metric objects, so a
metric registered elsewhere (``metric.register_judge_metric``) runs here like the shipped ones.
What a record read comes from ``read`` (default: ``strategies.contexts_of``, the one way to ask
it; the runner passes one with the run's resources).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ragbench.judge.calls import Job, Judge, add_cost, run_jobs, settled
from ragbench.judge.metric import Judged, JudgeMetric, Sample, Unasked, get_judge_metric
from ragbench.strategies import Contexts, contexts_of
from ragbench.types import Completion, Example, Record

# (example, record) -> what the record read (``strategies.contexts_of`` with the run's resources)
ReadFn = Callable[[Example, Record], Contexts]


def judge_records(
    items: Sequence[tuple[Example, Record]],
    metrics: Sequence[str],
    judge: Judge,
    read: ReadFn | None = None,
) -> list[Record]:
    """``items``' records with the deferred ``metrics`` they lack filled in (see the module
    docstring); records with an error, or already holding every metric, come back unchanged.
    An unknown metric name fails with the registered ones named."""
    todo = [[m for m in metrics if m not in r.scores] if r.error is None else [] for _, r in items]
    chosen = {name: get_judge_metric(name) for name in metrics}
    for name, metric in chosen.items():
        if metric.needs_embedder and judge.embedder is None and any(name in t for t in todo):
            raise ValueError(f"{name} needs an embedder (Judge.embedder)")
    read = read or (lambda example, record: contexts_of(record, example))
    judging = _Judging(items, chosen, judge, read)
    jobs = judging.plan(todo)
    completions: list[list[Completion]] = [[] for _ in items]
    run_jobs(jobs, judge, completions)
    judging.collect(jobs)
    judging.add_cost(completions)
    return judging.records()


@dataclasses.dataclass
class _Judging:
    """One ``judge_records`` call: its records, metrics and judge, the working copies of each
    record's scores and meta (filled in place), and the ``Sample`` of each record asked about."""

    items: Sequence[tuple[Example, Record]]
    chosen: dict[str, JudgeMetric]  # by name
    judge: Judge
    read: ReadFn
    scores: list[dict[str, Any]] = dataclasses.field(init=False)
    meta: list[dict[str, Any]] = dataclasses.field(init=False)
    samples: dict[int, Sample] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = [dict(r.scores) for _, r in self.items]
        self.meta = [dict(r.meta) for _, r in self.items]

    def _judged(self, i: int, grid: list[list[Any]]) -> Judged:
        return Judged(self.samples[i], grid, self.scores[i], self.meta[i])

    def plan(self, todo: list[list[str]]) -> list[Job]:
        """The judge calls of each record's ``todo`` metrics; the metrics that ask no LLM are
        collected now."""
        jobs: list[Job] = []
        unasked: dict[str, list[Judged]] = {name: [] for name in self.chosen}
        for i, (example, record) in enumerate(self.items):
            for name in todo[i]:
                if i not in self.samples:
                    self.samples[i] = Sample(example, record, self.read(example, record))
                metric = self.chosen[name]
                planned = _plan(
                    i, metric, self.samples[i], self.judge, self.scores[i], self.meta[i]
                )
                if planned is None:
                    unasked[name].append(self._judged(i, []))
                else:
                    jobs += planned
        for name, judged in unasked.items():
            self.chosen[name].collect(judged, self.judge)
        return jobs

    def collect(self, jobs: list[Job]) -> None:
        """The answered ``jobs`` scored, per metric: each record's calls in a grid of samples x
        units (``None``: a call that failed)."""
        finished: dict[str, list[Judged]] = {}
        for i, name, group in settled(jobs, self.items, self.meta, self.judge):
            units = 1 + max(j.unit for j in group)
            grid: list[list[Any]] = [[None] * units for _ in range(self.judge.samples)]
            for j in group:
                grid[j.sample][j.unit] = j
            finished.setdefault(name, []).append(self._judged(i, grid))
        for name, judged in finished.items():
            self.chosen[name].collect(judged, self.judge)

    def add_cost(self, completions: list[list[Completion]]) -> None:
        """Each record's judge calls costed in its meta, apart from its own cost."""
        for i, done in enumerate(completions):
            if done:
                add_cost(self.meta[i], done, self.judge.sheet)
                self.meta[i]["judge_model"] = self.judge.model

    def records(self) -> list[Record]:
        """The records, each replaced where its scores or meta changed."""
        return [
            dataclasses.replace(r, scores=self.scores[i], meta=self.meta[i])
            if self.scores[i] != r.scores or self.meta[i] != r.meta
            else r
            for i, (_, r) in enumerate(self.items)
        ]


def _plan(
    i: int, metric: JudgeMetric, sample: Sample, judge: Judge, scores: dict, meta: dict
) -> list[Job] | None:
    """The judge calls of ``metric`` on record ``i`` (None: it asks no LLM, ``collect`` scores
    it); a record settled without asking gets its score (None: unscored) and note instead."""
    name = metric.name
    prompt = judge.prompts[name] if metric.asks_llm else None
    if prompt is not None:
        meta[f"{name}_prompt"] = prompt.name
    try:
        metric.check(sample)
        units = metric.asks(sample, judge)
    except Unasked as outcome:
        scores[name] = outcome.score
        if outcome.note is not None:
            meta[f"{name}_note"] = outcome.note
        return []
    meta.update(metric.detail(units))
    if prompt is None:
        return None

    def parse(reply: str) -> object:
        return metric.parse(reply, prompt)

    max_new_tokens = metric.max_new_tokens(judge)
    for fields in units:  # a prompt the judge cannot read whole: unscored, not retried
        probe = Job(i, name, 0, fields, parse=parse, max_new_tokens=max_new_tokens)
        reason = judge.too_long(probe.request(judge, 1))
        if reason is not None:
            scores[name] = None
            meta[f"{name}_note"] = reason
            return []
    n = len(units)
    return [
        Job(
            i,
            name,
            s,
            fields,
            unit=u,
            tag=metric.tag(s, u, n),
            parse=parse,
            max_new_tokens=max_new_tokens,
        )
        for s in range(judge.samples)
        for u, fields in enumerate(units)
    ]
