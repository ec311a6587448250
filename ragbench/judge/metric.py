"""A judge metric is one class (``JudgeMetric``) that owns what scoring it takes, as RAGAS's
metrics do (``MetricWithLLM``: its required columns, its prompt, its ``_single_turn_ascore``):

- ``needs``: what it reads of a record, checked in order, each with the note a record that lacks
  it gets instead of a score: ``ANSWER`` (the strategy writes one), ``REFERENCES`` (gold
  answers), ``CONTEXT`` (the context as the prompt placed it) or ``CONTEXTS`` (the retrieved
  contexts, one each; both from ``strategies.contexts_of``: the one way to ask what a row read);
- ``prompt``: its default template (a shipped name such as ``correct-v1``, a YAML path, or a
  ``JudgePrompt``); the config's ``judge.prompts`` may name another;
- ``asks``: the fields of each judge call for one record (one call, or one per context,
  statement, generated question: the units); ``parse``: a reply -> its verdict (None:
  unreadable, asked again);
- ``score_samples`` (or the whole of ``collect``): the score from the parsed replies.

Every judge call, retry, sample (``Judge.samples``), cost and note every metric shares is the
judge pass's (``judging``, ``calls``), so a metric is only what differs. The registry
``JUDGE_METRICS`` maps a metric name to its class (lazy ``"module:Class"`` entries, an unknown
name fails with the valid choices); ``register_judge_metric`` adds one, and also declares it in
``metrics.answer.METRICS`` so a config can name it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ragbench.judge.calls import Job, Judge, keep_repeats
from ragbench.judge.prompts import JudgePrompt, load_prompt
from ragbench.metrics.answer import METRICS, Metric
from ragbench.registry import Registry
from ragbench.secrets import redact_text
from ragbench.strategies import Contexts, get_strategy
from ragbench.types import Example, Record

# what a metric reads of a record (``JudgeMetric.needs``)
ANSWER = "answer"  # the prediction: the strategy writes one (retrieve_only does not)
REFERENCES = "references"  # the example's gold answers
CONTEXT = "context"  # the context the model read, as its prompt placed it
CONTEXTS = "contexts"  # the retrieved contexts, one text each, best first


class Unasked(Exception):
    """A record's metric settled without asking the judge: ``score`` (None: unscored) and the
    ``note`` saying why."""

    def __init__(self, score: float | None, note: str | None = None) -> None:
        super().__init__(note)
        self.score, self.note = score, note


class Sample:
    """One record as a judge metric reads it (RAGAS's ``SingleTurnSample``): the question, the
    answer, the gold answers and what it read, its contexts rebuilt once, on first need."""

    def __init__(self, example: Example, record: Record, read: Contexts | None) -> None:
        self.example, self.record, self.read = example, record, read
        self.question: str = example.question
        self.answer: str = record.prediction
        self._got: dict[str, tuple[Any, str | None]] = {}

    @property
    def generates(self) -> bool:
        """Whether the record's strategy writes an answer (retrieve_only does not)."""
        return get_strategy(self.record.strategy).generates

    @property
    def references(self) -> list[str]:
        """The non-blank gold answers."""
        return [a for a in self.example.answers if a.strip()]

    def asked_about(self) -> dict[str, str]:
        """The question and the gold answers, as a judge prompt shows them (``a | b``)."""
        return {"question": self.question, "answers": " | ".join(self.references)}

    def context(self) -> str:
        """The context as the prompt placed it (an empty one too: a pipeline that returned no
        context); ``Unasked`` (None) when it read none."""
        return self._need(CONTEXT, "context", "gives the model no context")

    def contexts(self) -> list[str]:
        """The retrieved contexts, best first; ``Unasked`` (None) when there are none."""
        return self._need(CONTEXTS, "contexts", "records no retrieved contexts")

    def _need(self, key: str, what: str, none: str) -> Any:
        if key not in self._got:
            try:
                read = self.read
                value = None if read is None else read.text() if key == CONTEXT else read.texts()
                missing = value is None if key == CONTEXT else not value
                self._got[key] = (value, f"{self.record.strategy} {none}" if missing else None)
            except Exception as exc:  # cannot be rebuilt: unscored, said why
                self._got[key] = (None, redact_text(f"{what} unavailable: {exc}"))
        value, why = self._got[key]
        if why is not None:
            raise Unasked(None, why)
        return value


@dataclass
class Judged:
    """One record's finished judgement of one metric: its jobs by [sample][unit], and the
    record's scores and meta the metric writes into."""

    sample: Sample
    grid: list[list[Job]]
    scores: dict[str, object]
    meta: dict[str, object] = field(default_factory=dict)


class JudgeMetric:
    """One judge metric (see the module docstring). Subclasses set ``name``, ``needs`` and
    ``prompt`` and write ``asks``, and ``score_samples`` (or ``collect``) where one verdict per
    sample is not the score."""

    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()  # checked in order (module docstring)
    prompt: ClassVar[str | JudgePrompt | None] = None  # None: asks no LLM (an embedding metric)
    # one verdict per context / statement / question: ``<metric>_verdicts`` holds them per
    # sample, and agreement (Fleiss' kappa) rates those units; else one verdict per sample
    by_unit: ClassVar[bool] = False
    # agreement also compares its verdicts with exact match and F1 (a correctness judge)
    against_strings: ClassVar[bool] = False
    needs_embedder: ClassVar[bool] = False  # raises at once without ``Judge.embedder``
    # what ``ragbench list metrics`` says of a metric ``register_judge_metric`` adds (empty: the
    # docstring's first line); a shipped metric is declared in ``metrics.answer.METRICS``
    description: ClassVar[str] = ""

    @property
    def asks_llm(self) -> bool:
        return self.prompt is not None

    def template(self) -> JudgePrompt:
        """Its default template, loaded."""
        if self.prompt is None:
            raise ValueError(f"judge metric {self.name!r} asks no judge LLM: it has no prompt")
        return self.prompt if isinstance(self.prompt, JudgePrompt) else load_prompt(self.prompt)

    def check(self, sample: Sample) -> None:
        """``Unasked`` with the note of the first thing in ``needs`` the record lacks."""
        for need in self.needs:
            if need == ANSWER and not sample.generates:
                raise Unasked(None, f"{sample.record.strategy} writes no answer")
            if need == REFERENCES and not sample.references:
                raise Unasked(None, "no gold answers")
            if need == CONTEXT:
                sample.context()
            if need == CONTEXTS:
                sample.contexts()

    def asks(self, sample: Sample, judge: Judge) -> list[dict[str, str]]:
        """The template fields of each judge call (unit) for ``sample``, asked once per judge
        sample; ``Unasked`` when the record's score is settled without asking."""
        raise NotImplementedError

    def detail(self, units: Sequence[dict[str, str]]) -> dict[str, object]:
        """Meta the record keeps once its units are known (``context_recall_statements``)."""
        return {}

    def tag(self, sample: int, unit: int, units: int) -> int:
        """The request's sample tag: its own cache key and RNG (``calls``); the units of one
        sample differ by their prompt, so they share the sample's tag."""
        return sample

    def max_new_tokens(self, judge: Judge) -> int | None:
        """New tokens each call may write (None: the judge's)."""
        return None

    def parse(self, reply: str, prompt: JudgePrompt) -> object:
        """The verdict in ``reply`` (None: unreadable, asked again with the reminder)."""
        return prompt.parse(reply)

    def score_samples(self, verdicts: list[Any]) -> float:
        """One sample's score from its units' verdicts (every one read): a metric of one call
        per sample scores its verdict; one of several units (``by_unit``) says how."""
        if self.by_unit:
            raise NotImplementedError
        return verdicts[0]

    def collect(self, judged: list[Judged], judge: Judge) -> None:
        """Scores and detail of every finished record: ``<metric>_replies`` (and with units
        ``<metric>_verdicts``), and through ``calls.keep_repeats`` ``<metric>_samples``, the
        score (their mean) and ``<metric>_spread``. A sample with an unreadable unit has no
        score (None), never 0."""
        for done in judged:
            replies = [[j.reply for j in row] for row in done.grid]
            verdicts = [[j.verdict for j in row] for row in done.grid]
            per_sample = [None if None in v else self.score_samples(v) for v in verdicts]
            if self.by_unit:
                done.meta[f"{self.name}_replies"] = replies
                done.meta[f"{self.name}_verdicts"] = verdicts
                keep_repeats(self.name, per_sample, done.scores, done.meta)
            else:  # one call per sample: flat lists
                keep_repeats(self.name, per_sample, done.scores, done.meta)
                done.meta[f"{self.name}_replies"] = [row[0] for row in replies]


JUDGE_METRICS = Registry(
    "judge metric",
    {
        "judge_correct": "ragbench.judge.answer_metrics:JudgeCorrect",
        "judge_faithful": "ragbench.judge.answer_metrics:JudgeFaithful",
        "semantic_similarity": "ragbench.judge.answer_metrics:SemanticSimilarity",
        "context_precision": "ragbench.judge.context_metrics:ContextPrecision",
        "context_recall": "ragbench.judge.context_metrics:ContextRecall",
        "answer_relevancy": "ragbench.judge.context_metrics:AnswerRelevancy",
    },
)


def get_judge_metric(name: str) -> JudgeMetric:
    """The metric ``name`` (an instance of its class); an unknown name fails with the choices."""
    return JUDGE_METRICS.get(name)()


def judged_metrics() -> list[str]:
    """Names of the registered metrics that ask the judge LLM, the shipped ones first in their
    order (the agreement table's rows)."""
    return [n for n in JUDGE_METRICS.in_order() if get_judge_metric(n).asks_llm]


def register_judge_metric(cls: type[JudgeMetric], version: int = 1) -> None:
    """Register ``cls`` under its ``name`` in ``JUDGE_METRICS``, and declare it in ``METRICS``
    (kind ``judge``, or ``embedding`` without a prompt) so a config can name it."""
    JUDGE_METRICS.register(cls.name, cls)
    about = cls.description or (cls.__doc__ or "").strip().split("\n")[0]
    METRICS.register(
        cls.name, Metric(cls.name, None, kind=metric_kind(cls), description=about, version=version)
    )


def metric_kind(cls: type[JudgeMetric]) -> str:
    """The ``Metric.kind`` a judge metric class is declared with: ``judge`` when it asks a judge
    LLM (it has a prompt), else ``embedding``."""
    return "judge" if cls.prompt is not None else "embedding"


def unregister_judge_metric(name: str) -> None:
    """Undo ``register_judge_metric`` (a plugin or a test)."""
    JUDGE_METRICS.unregister(name)
    METRICS.unregister(name)
