"""The judge's calls: what every judge metric shares.

``Judge`` holds what the judge pass needs (the judge LLM, its templates, ``samples``, the
embedder); ``Job`` is one judgement of one record (for the context metrics: of one context,
statement or generated question of it); ``run_jobs`` asks, parses and asks again with the
template's reminder until each job is read or out of attempts; ``settled`` groups the finished
jobs by (record, metric) and writes the notes every metric shares (a failed call, unreadable
replies); ``add_cost`` adds what the calls cost to a record's ``judge_*`` meta columns, never to
its cost.

N different judgements, deterministically (the config's ``judge.repeats``, here ``samples``: one
sample per repeat): ``samples > 1`` needs ``temperature > 0`` (the config checks it), and sample
k > 0 carries a tag in its system message, so each sample is its own request: its own
completion-cache key, and on the transformers backend its own sampling RNG (seeded from the
request). Served models sample nondeterministically on the first run; the cache then replays the
same N judgements on every rerun. Sample 0 has no tag, so raising ``samples`` keeps the
judgements already made.

``keep_repeats`` writes what every judged metric keeps of its repeats: ``<metric>_samples``
(each repeat's score, None where unreadable), the score (their mean, over the readable ones) and,
with more than one repeat, ``<metric>_spread``: the standard deviation of the readable repeats'
scores (population, ddof 0: 0 when they agree; at most 0.5 for 0/1 verdicts; None with fewer
than two readable).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragbench.cost.accounting import Cost
from ragbench.cost.prices import PriceSheet
from ragbench.judge.prompts import JudgePrompt
from ragbench.secrets import redact_text
from ragbench.strategies.driver import outcomes
from ragbench.types import Completion, GenerationRequest

log = logging.getLogger(__name__)

COST_KEYS = (
    "judge_calls",
    "judge_prompt_tokens",
    "judge_cached_prompt_tokens",
    "judge_completion_tokens",
    "judge_latency_seconds",
    "judge_resource_seconds",
    "judge_dollars",
)
REPLY_EXCERPT = 120  # characters of an unreadable reply quoted in its note
QUESTIONS = 3  # answer_relevancy: questions generated per answer (RAGAS's default strictness)


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
    sheet: PriceSheet | None = None  # the judge model's price sheet: judge_dollars
    embedder: Any = None  # semantic_similarity, answer_relevancy
    model: str = ""  # judge model name, recorded in meta["judge_model"]
    questions: int = QUESTIONS  # answer_relevancy: questions generated per answer and sample

    def __post_init__(self) -> None:
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(
                f"judge samples={self.samples} needs temperature > 0: greedy samples of one "
                "prompt are copies and their agreement would mean nothing"
            )
        if self.questions < 1:
            raise ValueError(f"judge questions must be >= 1, got {self.questions}")

    def request(
        self,
        prompt: JudgePrompt,
        sample: int,
        attempt: int,
        max_new_tokens: int | None = None,
        **fields: str,
    ) -> GenerationRequest:
        system = prompt.system
        if sample > 0:  # its own cache key and RNG seed (see the module docstring)
            system += f"\n(Independent judgement {sample + 1}.)"
        return GenerationRequest(
            prompt=prompt.render(attempt, **fields),
            system=system,
            max_new_tokens=max_new_tokens or self.max_new_tokens,
            temperature=self.temperature,
            id=f"judge:{prompt.name}:{sample}:{attempt}",
        )

    def too_long(self, request: GenerationRequest) -> str | None:
        """Why the judge cannot read ``request`` whole (None: it can). A fact of this judge, so
        the judgement is unscored with this reason, never retried."""
        need = self.llm.prompt_tokens(request) + request.max_new_tokens
        if need > self.llm.context_window:
            return (
                f"judge prompt needs {need} tokens; the judge's window is {self.llm.context_window}"
            )
        return None


@dataclass
class Job:
    """One judgement of one (record, metric, sample[, unit]): its attempts so far."""

    item: int
    metric: str
    sample: int
    fields: dict[str, str]
    unit: int = 0  # the context / statement / question of a context metric (else 0)
    tag: int | None = None  # the request's sample tag (None: ``sample``)
    parse: Callable[[str], object] | None = None  # reply -> verdict or None (None: the template's)
    max_new_tokens: int | None = None  # None: the judge's
    attempt: int = 0
    verdict: Any = None
    reply: str = ""
    error: str | None = None
    done: bool = False

    def request(self, judge: Judge, attempt: int | None = None) -> GenerationRequest:
        tag = self.sample if self.tag is None else self.tag
        return judge.request(
            judge.prompts[self.metric],
            tag,
            attempt or self.attempt,
            self.max_new_tokens,
            **self.fields,
        )

    def read(self, judge: Judge, reply: str) -> object:
        return (self.parse or judge.prompts[self.metric].parse)(reply)


def run_jobs(jobs: Sequence[Job], judge: Judge, completions: list[list[Completion]]) -> None:
    """Ask, parse, and ask again (with the reminder) until read or out of attempts; each
    completion is appended to its record's list in ``completions`` (for ``add_cost``)."""
    while pending := [j for j in jobs if not j.done]:
        for start in range(0, len(pending), judge.batch_size):
            batch = pending[start : start + judge.batch_size]
            for j in batch:
                j.attempt += 1
            requests = [j.request(judge) for j in batch]
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
                j.verdict = j.read(judge, out.text)
                j.done = j.verdict is not None or j.attempt >= judge.max_attempts


def settled(
    jobs: Sequence[Job], items: Sequence[Any], meta: list[dict[str, Any]], judge: Judge
) -> Iterator[tuple[int, str, list[Job]]]:
    """The finished ``jobs`` as ``(record index, metric, its jobs)``, in job order. A group with a
    failed call (the judge, not its reply) gets a ``<metric>_note`` and is skipped: the metric
    stays missing and a rerun retries it. The others get a note on their unreadable replies, or
    lose an earlier pass's."""
    groups: dict[tuple[int, str], list[Job]] = {}
    for j in jobs:
        groups.setdefault((j.item, j.metric), []).append(j)
    for (i, metric), group in groups.items():
        errors = [j.error for j in group if j.error]
        if errors:
            meta[i][f"{metric}_note"] = redact_text(f"judge call failed: {errors[0]}")
            log.warning("%s: %s not scored: %s", items[i][1].example_id, metric, errors[0])
            continue
        bad = [j for j in group if j.verdict is None]
        if bad:
            meta[i][f"{metric}_note"] = (
                f"{len(bad)} of {len(group)} judge replies unreadable after {judge.max_attempts} "
                f"attempts; last: {bad[-1].reply[:REPLY_EXCERPT]!r}"
            )
        else:
            meta[i].pop(f"{metric}_note", None)
        yield i, metric, group


def keep_repeats(
    metric: str, per_sample: Sequence[Any], score: dict[str, Any], meta: dict[str, Any]
) -> None:
    """One record's ``metric`` from its repeats' scores ``per_sample`` (see the module
    docstring): ``<metric>_samples``, the mean as the score, and with more than one repeat
    ``<metric>_spread``."""
    per_sample = list(per_sample)
    meta[f"{metric}_samples"] = per_sample
    read = [float(x) for x in per_sample if x is not None]
    score[metric] = sum(read) / len(read) if read else None
    if len(per_sample) > 1:
        mean = score[metric]
        meta[f"{metric}_spread"] = (
            (sum((x - mean) ** 2 for x in read) / len(read)) ** 0.5 if len(read) > 1 else None
        )


def add_cost(meta: dict[str, Any], done: list[Completion], sheet: PriceSheet | None) -> None:
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
