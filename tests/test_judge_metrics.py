"""Judge metrics as classes (``ragbench.judge.metric``): a metric registered from here runs in the
judge pass like the shipped ones; unknown names fail with the valid choices; and what a row read
comes from one place (``strategies.contexts_of``) for the judge, attribution and the noise pass."""

from __future__ import annotations

import re

import pytest

from ragbench.experiment.noise_pass import ineligible
from ragbench.judge.calls import Judge
from ragbench.judge.judging import judge_records
from ragbench.judge.metric import (
    ANSWER,
    CONTEXTS,
    JUDGE_METRICS,
    JudgeMetric,
    get_judge_metric,
    judged_metrics,
    metric_kind,
    register_judge_metric,
    unregister_judge_metric,
)
from ragbench.judge.prompts import load_prompt, parse_prompt
from ragbench.llm.fake import FakeLLM
from ragbench.metrics.answer import METRICS
from ragbench.registry import UnknownNameError
from ragbench.strategies import FULL_CONTEXT, NO_CONTEXT, RETRIEVED, contexts_of
from ragbench.strategies.params import ClosedBookParams
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.types import Document, Example, Record

SUPPORTS = parse_prompt(
    {
        "name": "mentions-v1",
        "metric": "context_mentions",
        "labels": {"MENTIONS": 1, "SILENT": 0},
        "system": "You check whether a passage mentions an answer.",
        "user": "Passage: {context}\nAnswer: {prediction}\nVerdict: MENTIONS or SILENT",
        "retry": "\n(Attempt {attempt}: reply with one line.)",
    }
)


class ContextMentions(JudgeMetric):
    """A toy metric: the share of the retrieved contexts that mention the answer."""

    name = "context_mentions"
    needs = (ANSWER, CONTEXTS)
    prompt = SUPPORTS
    by_unit = True
    description = "share of the retrieved contexts that mention the answer"

    def asks(self, sample, judge):
        return [{"context": c, "prediction": sample.answer} for c in sample.contexts()]

    def score_samples(self, verdicts):
        return sum(verdicts) / len(verdicts)


@pytest.fixture
def mentions():
    register_judge_metric(ContextMentions)
    yield
    unregister_judge_metric("context_mentions")


def mentions_judge(request):
    context = re.search(r"Passage: (.*)\n", request.prompt)[1]
    answer = re.search(r"Answer: (.*)\n", request.prompt)[1]
    return "Verdict: MENTIONS" if answer in context else "Verdict: SILENT"


PIPE = PipelineParams(url="http://x/a")


def pipeline_record(prediction, texts, **meta):
    contexts = [{"text": t} for t in texts]
    return Record(
        "paris", "pipeline", PIPE, prediction, ("Paris",), meta={"contexts": contexts, **meta}
    )


EXAMPLE = Example(
    "paris",
    "What is the capital of France?",
    ("Paris",),
    (Document("d", "Paris is the capital of France."),),
)


def test_shipped_judge_metrics_are_declared_once_for_configs():
    """A shipped judge metric is one class (behaviour) and one ``METRICS`` entry (what a config
    names, its kind and description): the two registries hold the same names, the kinds agree
    with the classes, and the classes declare no description of their own to drift from it."""
    deferred = {n for n in METRICS if METRICS.get(n).kind in ("judge", "embedding")}
    assert deferred == set(JUDGE_METRICS)
    for name in JUDGE_METRICS:
        cls = get_judge_metric(name)
        assert cls.name == name and METRICS.get(name).kind == metric_kind(cls), name
        assert cls.description == "" and METRICS.get(name).description, name

    # one registered without a description is described by its docstring's first line
    class Terse(ContextMentions):
        """Counts mentions tersely."""

        name = "terse_mentions"
        description = ""

    register_judge_metric(Terse)
    try:
        assert METRICS.get("terse_mentions").description == "Counts mentions tersely."
    finally:
        unregister_judge_metric("terse_mentions")


def test_a_metric_class_registered_from_a_test_is_run_by_the_judge_pass(mentions):
    assert "context_mentions" in JUDGE_METRICS and METRICS.get("context_mentions").kind == "judge"
    assert "context_mentions" in judged_metrics()  # the agreement table lists it
    llm = FakeLLM("judge-fake", answer_fn=mentions_judge)
    judge = Judge(
        llm=llm,
        prompts={"context_mentions": get_judge_metric("context_mentions").template()},
        model="judge-fake",
    )
    good = pipeline_record("Paris", ["Paris is big.", "Lyon is old.", "Paris again."])
    cut = pipeline_record("Paris", ["Paris"], contexts_truncated=True)
    closed = Record("paris", "closed_book", ClosedBookParams(), "Paris", ("Paris",))
    items = [(EXAMPLE, good), (EXAMPLE, cut), (EXAMPLE, closed)]
    out = judge_records(items, ["context_mentions"], judge)
    assert out[0].scores["context_mentions"] == pytest.approx(2 / 3)
    assert out[0].meta["context_mentions_verdicts"] == [[1, 0, 1]]
    assert out[0].meta["context_mentions_prompt"] == "mentions-v1"
    assert out[0].meta["judge_calls"] == 3  # one per context
    calls = llm.calls
    # what it needs, checked by the pass: contexts cut short, or none at all
    assert out[1].scores["context_mentions"] is None
    assert "contexts unavailable" in out[1].meta["context_mentions_note"]
    assert out[2].scores["context_mentions"] is None
    assert out[2].meta["context_mentions_note"] == "closed_book records no retrieved contexts"
    # asked again, nothing is left to do
    again = judge_records([(EXAMPLE, out[0])], ["context_mentions"], judge)
    assert again[0] is out[0] and llm.calls == calls


def test_unknown_judge_metric_names_fail_with_the_valid_choices():
    judge = Judge(llm=FakeLLM("judge-fake"), prompts={"judge_correct": load_prompt("correct-v1")})
    record = Record("paris", "closed_book", ClosedBookParams(), "Paris", ("Paris",))
    with pytest.raises(
        UnknownNameError,
        match="did you mean 'judge_correct'.*valid: .*answer_relevancy.*context_precision",
    ):
        judge_records([(EXAMPLE, record)], ["judge_corect"], judge)
    with pytest.raises(ValueError, match="unknown judge metric 'context_recal'.*context_recall"):
        get_judge_metric("context_recal")


def test_the_shipped_metrics_are_classes_that_own_their_prompt():
    shipped = [
        "judge_correct",
        "judge_faithful",
        "context_precision",
        "context_recall",
        "answer_relevancy",
    ]
    assert judged_metrics() == shipped  # the order of the agreement table's rows
    for name in shipped:
        metric = get_judge_metric(name)
        assert isinstance(metric, JudgeMetric) and metric.template().metric == name
    assert not get_judge_metric("semantic_similarity").asks_llm
    assert get_judge_metric("judge_correct").against_strings
    assert get_judge_metric("context_precision").by_unit


def test_one_contexts_answers_the_judge_attribution_and_the_noise_pass():
    closed = Record("q", "closed_book", ClosedBookParams(), "Paris", ("Paris",))
    read = contexts_of(closed, EXAMPLE)
    assert read.source == NO_CONTEXT and read.text() is None and read.texts() is None
    assert read.corpus_note == "reads no documents" == ineligible(closed)
    # a results-table row: a router's long-context branch keeps its facts under lc_
    row = contexts_of({"strategy": "self_route", "route": "long_context"})
    assert (row.source, row.meta_prefix, row.corpus_note) == (FULL_CONTEXT, "lc_", None)
    assert contexts_of({"strategy": "self_route"}).source == RETRIEVED
    # a pipeline's contexts are in its record; its own index is no corpus of the run's
    pipe = pipeline_record("Paris", ["one", "two"], pipeline_index="own index")
    assert contexts_of(pipe).texts() == ["one", "two"] and contexts_of(pipe).text() == "one\n\ntwo"
    assert "its own index" in ineligible(pipe)
    # a strategy this version does not know (an older table): read by its row
    assert contexts_of({"strategy": "gone", "gold_hit": True}).source == RETRIEVED
    assert contexts_of({"strategy": "gone"}).source is None
