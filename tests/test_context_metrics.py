"""RAGAS-style context metrics judged by the judge model (``ragbench.judge.context_metrics``):
``context_precision`` and ``context_recall`` on a small hand-labelled set equal the values
computed by hand, ``answer_relevancy`` equals the cosine computed by hand with the ``hash``
embedder, unreadable replies and records without contexts are unscored (never 0), agreement
across samples, and a run through ``ragbench.run`` with a ``pipeline`` and the built-in ``rag``
that a rerun serves entirely from the completion cache."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pandas as pd
import pytest

import ragbench
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.judge import Judge, judge_agreement, judge_records, judge_warnings, load_prompt
from ragbench.judge.agreement import fleiss_kappa
from ragbench.judge.context_metrics import average_precision, statements
from ragbench.llm.cache import CachedLLM
from ragbench.llm.fake import FakeLLM, answer_from_prompt
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.strategies import contexts_of
from ragbench.strategies.params import ClosedBookParams
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.types import Document, Example, Record

METRICS = ("context_precision", "context_recall", "answer_relevancy")
PIPE = PipelineParams(url="http://pipeline.invalid/answer")

# ---------------------------------------------------------------------------- the formulas


def ragas_average_precision(verdicts):
    """RAGAS's ``_calculate_average_precision`` (src/ragas/metrics/_context_precision.py), as
    written there: the reference the formula here must equal."""
    denominator = sum(verdicts) + 1e-10
    numerator = sum((sum(verdicts[: i + 1]) / (i + 1)) * verdicts[i] for i in range(len(verdicts)))
    return numerator / denominator


@pytest.mark.parametrize(
    ("verdicts", "by_hand"),
    [
        ([1, 0, 1], (1 / 1 + 2 / 3) / 2),  # precision@1 = 1, precision@3 = 2/3; 2 useful
        ([0, 1, 1], (1 / 2 + 2 / 3) / 2),
        ([0, 0, 0, 1], (1 / 4) / 1),
        ([1, 1], 1.0),
        ([0, 0], 0.0),  # none useful: 0
    ],
)
def test_average_precision_by_hand_and_as_ragas(verdicts, by_hand):
    assert average_precision(verdicts) == pytest.approx(by_hand)
    assert average_precision(verdicts) == pytest.approx(ragas_average_precision(verdicts))


def test_statements_are_sentences_of_each_distinct_gold_answer():
    assert statements(["Paris"]) == ["Paris"]  # a short answer: one statement
    assert statements(
        ["Rome is the capital of Italy. It lies on the Tiber.", "rome is the capital of Italy."]
    ) == [  # the alias repeats the first sentence
        "Rome is the capital of Italy.",
        "It lies on the Tiber.",
    ]
    assert statements(["4817263", "5920114", " "]) == ["4817263", "5920114"]


# ---------------------------------------------------------------------------- a hand-labelled set

# Each context and statement is labelled by hand: the scripted judge answers with these labels.
USEFUL = {
    "Paris is the capital and largest city of France.": 1,
    "Lyon is a city in France known for its food.": 0,
    "The Eiffel Tower stands in Paris, the French capital.": 1,
    "Milan is the capital of Lombardy.": 0,
    "Rome has been the capital of Italy since 1871.": 1,
    "Barcelona is the capital of Catalonia.": 0,
    "Seville is in Andalusia.": 0,
    "Valencia lies on the Mediterranean.": 0,
    "Bilbao is in the Basque Country.": 0,
    "The special magic number for quiet-lake is 4817263.": 1,
    "The special magic numbers for red-fox are 5920114 and 6031875.": 1,
}
SUPPORTED = {
    "Paris": 1,
    "Rome is the capital of Italy.": 1,
    "It lies on the Tiber.": 0,  # no context mentions the Tiber
    "Madrid": 0,  # no context names Madrid
    "4817263": 1,
    "5920114": 0,  # labelled unsupported (the number is about red-fox, the question quiet-lake)
}
SET = [  # (id, question, gold answers, contexts in rank order)
    (
        "paris",
        "What is the capital of France?",
        ("Paris",),
        [
            "Paris is the capital and largest city of France.",
            "Lyon is a city in France known for its food.",
            "The Eiffel Tower stands in Paris, the French capital.",
        ],
    ),
    (
        "rome",
        "What is the capital of Italy?",
        ("Rome is the capital of Italy. It lies on the Tiber.",),
        ["Milan is the capital of Lombardy.", "Rome has been the capital of Italy since 1871."],
    ),
    (
        "madrid",
        "What is the capital of Spain?",
        ("Madrid", "madrid"),
        [
            "Barcelona is the capital of Catalonia.",
            "Seville is in Andalusia.",
            "Valencia lies on the Mediterranean.",
            "Bilbao is in the Basque Country.",
        ],
    ),
    (
        "magic",
        "Which special magic numbers are mentioned?",
        ("4817263", "5920114"),
        [
            "The special magic number for quiet-lake is 4817263.",
            "The special magic numbers for red-fox are 5920114 and 6031875.",
        ],
    ),
]
# By hand, with v_k the USEFUL labels in rank order and AP = sum_k precision@k * v_k / sum v:
# paris  v = 1 0 1  -> (1/1 + 2/3) / 2 = 5/6;  statements [Paris] -> 1/1
# rome   v = 0 1    -> (1/2) / 1 = 1/2;        statements [Rome is..., It lies...] -> 1/2
# madrid v = 0 0 0 0 -> 0 (none useful);       statements [Madrid] (alias deduplicated) -> 0/1
# magic  v = 1 1    -> (1/1 + 2/2) / 2 = 1;    statements [4817263, 5920114] -> 1/2
PRECISION = {"paris": 5 / 6, "rome": 1 / 2, "madrid": 0.0, "magic": 1.0}
RECALL = {"paris": 1.0, "rome": 1 / 2, "madrid": 0.0, "magic": 1 / 2}


def passage(prompt):
    return prompt.split("<<<\n", 1)[1].split("\n>>>", 1)[0]


def labelled_judge(request):
    """Replies with the hand labels: USEFUL for a passage, SUPPORTED for a statement."""
    if "Retrieved passage:" in request.prompt:
        return "Verdict: USEFUL" if USEFUL[passage(request.prompt)] else "Verdict: USELESS"
    statement = re.search(r"Statement from the reference answer: (.*)", request.prompt)[1]
    return "Verdict: SUPPORTED" if SUPPORTED[statement] else "Verdict: UNSUPPORTED"


def labelled_items():
    items = []
    for eid, question, answers, contexts in SET:
        example = Example(eid, question, answers, (Document("d", " ".join(contexts)),))
        meta = {"contexts": [{"id": f"c{k}", "text": c} for k, c in enumerate(contexts)]}
        items.append((example, Record(eid, "pipeline", PIPE, answers[0], answers, meta=meta)))
    return items


def make_judge(answer_fn, metrics=METRICS, **kw):
    llm = FakeLLM("judge-fake", answer_fn=answer_fn)
    prompts = {m: load_prompt(m.replace("_", "-") + "-v1") for m in metrics}
    return llm, Judge(llm=llm, prompts=prompts, model="judge-fake", **kw)


def no_resources():
    raise AssertionError("a pipeline's contexts are in its record: no resources needed")


def read(example, record):
    return contexts_of(record, example, no_resources)


def test_hand_labelled_set_equals_the_hand_computed_values():
    llm, judge = make_judge(labelled_judge, METRICS[:2])
    out = judge_records(labelled_items(), METRICS[:2], judge, read)
    for record in out:
        eid = record.example_id
        assert record.scores["context_precision"] == pytest.approx(PRECISION[eid]), eid
        assert record.scores["context_recall"] == pytest.approx(RECALL[eid]), eid
        contexts = dict((e, c) for e, _, _, c in SET)[eid]
        assert record.meta["context_precision_verdicts"] == [[USEFUL[c] for c in contexts]]
        stated = record.meta["context_recall_statements"]
        assert record.meta["context_recall_verdicts"] == [[SUPPORTED[s] for s in stated]]
        # one call per context and per statement, costed apart from the record
        assert record.meta["judge_calls"] == len(contexts) + len(stated)
        assert record.meta["judge_prompt_tokens"] > 0 and record.cost is None
        assert record.meta["context_precision_prompt"] == "context-precision-v1"
    assert sum(r.meta["judge_calls"] for r in out) == 11 + 6


def test_samples_judge_every_context_again_and_agreement_is_over_contexts():
    def flaky(request):  # sample 2 calls Lyon useful: the samples disagree on one context
        if "judgement 2." in request.system and "Lyon" in request.prompt:
            return "Verdict: USEFUL"
        return labelled_judge(request)

    _, judge = make_judge(flaky, METRICS[:1], samples=2, temperature=0.7)
    out = judge_records(labelled_items(), METRICS[:1], judge, read)
    paris = out[0]
    # sample 1: 1 0 1 -> 5/6; sample 2: 1 1 1 -> 1; the score is their mean
    assert paris.meta["context_precision_verdicts"] == [[1, 0, 1], [1, 1, 1]]
    assert paris.meta["context_precision_samples"] == pytest.approx([5 / 6, 1.0])
    assert paris.scores["context_precision"] == pytest.approx((5 / 6 + 1) / 2)
    assert out[1].scores["context_precision"] == pytest.approx(PRECISION["rome"])
    df = pd.DataFrame(
        [
            {
                "example_id": r.example_id,
                "prediction": r.prediction,
                "answers": list(r.answers),
                "error": None,
                **r.scores,
                **r.meta,
            }
            for r in out
        ]
    )
    row = judge_agreement(df).set_index("metric").loc["context_precision"]
    # items: the 11 contexts, each rated by the 2 samples; they disagree on Lyon only
    units = [[1, 1], [0, 1], [1, 1], [0, 0], [1, 1], [0, 0], [0, 0], [0, 0], [0, 0], [1, 1], [1, 1]]
    assert (row.samples, row.n_fleiss, row.n_scored) == (2, 11, 4)
    assert row.fleiss_kappa == pytest.approx(fleiss_kappa(units))
    assert row.judge_model == "judge-fake"
    small = df.assign(judge_model="smollm2-135m-instruct")
    [warning] = [w for w in judge_warnings(small) if w.startswith("context_precision")]
    assert "Fleiss' kappa" in warning and "Cohen" not in warning  # no gold comparison here


# ---------------------------------------------------------------------------- answer relevancy

GENERATED = {  # the question the scripted judge writes, by the request's sample tag
    "": "What is the capital of France?",
    "2": "Which city is the capital of France?",
    "3": "What is the largest city in France?",
}


def question_writer(request):
    tag = re.search(r"judgement (\d+)\.", request.system)
    evasive = request.prompt.startswith("Answer: I am not sure")
    verdict = "NONCOMMITTAL" if evasive else "COMMITTAL"
    return f"Verdict: {verdict}\nQuestion: {GENERATED[tag[1] if tag else '']}"


def test_answer_relevancy_is_the_cosine_computed_by_hand():
    embedder = get_embedder("hash")
    seen = []

    def judge_fn(request):
        seen.append(request)
        return question_writer(request)

    _, judge = make_judge(judge_fn, METRICS[2:], embedder=embedder, temperature=0.5)
    items = labelled_items()[:1]
    sure = Record("paris", "closed_book", ClosedBookParams(), "Paris is the capital.", ("Paris",))
    unsure = Record("paris", "closed_book", ClosedBookParams(), "I am not sure.", ("Paris",))
    empty = Record("paris", "closed_book", ClosedBookParams(), "", ("Paris",))
    ex = items[0][0]
    out = judge_records([(ex, sure), (ex, unsure), (ex, empty)], ["answer_relevancy"], judge)
    # by hand: the embedder's unit vectors, one dot product per generated question, their mean
    vectors = embedder.embed_queries([ex.question, *GENERATED.values()])
    by_hand = np.mean([float(vectors[0] @ vectors[k]) for k in (1, 2, 3)])
    assert 0 < by_hand < 1
    assert out[0].scores["answer_relevancy"] == pytest.approx(by_hand, abs=1e-6)
    assert out[0].meta["answer_relevancy_questions"] == [list(GENERATED.values())]
    assert out[0].meta["answer_relevancy_verdicts"] == [[1, 1, 1]]
    assert out[1].scores["answer_relevancy"] == 0.0  # noncommittal: times 0
    assert out[1].meta["answer_relevancy_verdicts"] == [[0, 0, 0]]
    assert (
        out[2].scores["answer_relevancy"] == 0.0 and "empty" in out[2].meta["answer_relevancy_note"]
    )
    # three distinct requests per answer (their own cache keys), sampled at the judge's temperature
    assert len(seen) == 6 and len({(r.system, r.prompt) for r in seen}) == 6
    assert {r.temperature for r in seen} == {0.5} and min(r.max_new_tokens for r in seen) >= 64


# ---------------------------------------------------------------------------- unscored paths


def test_unreadable_replies_and_records_without_contexts_are_unscored():
    def judge_fn(request):
        if "Retrieved passage:\n<<<\nLyon" in request.prompt:
            return "It could go either way."  # never a verdict
        return labelled_judge(request)

    llm, judge = make_judge(judge_fn, METRICS[:2], max_attempts=2)
    paris_ex, paris = labelled_items()[0]
    closed = Record("paris", "closed_book", ClosedBookParams(), "Paris", ("Paris",))
    no_gold_ex = Example("x", "What is the capital of France?", (), paris_ex.documents)
    no_gold = Record("x", "pipeline", PIPE, "Paris", (), meta=paris.meta)
    cut = Record(
        "paris",
        "pipeline",
        PIPE,
        "Paris",
        ("Paris",),
        meta={**paris.meta, "contexts_truncated": True},
    )
    items = [(paris_ex, paris), (paris_ex, closed), (no_gold_ex, no_gold), (paris_ex, cut)]
    out = judge_records(items, METRICS[:2], judge, read)
    # the Lyon context's reply is unreadable (asked twice): precision unscored, never 0
    assert out[0].scores["context_precision"] is None
    assert out[0].meta["context_precision_verdicts"] == [[1, None, 1]]
    assert out[0].meta["context_precision_samples"] == [None]
    assert (
        "1 of 3 judge replies unreadable after 2 attempts" in out[0].meta["context_precision_note"]
    )
    assert out[0].scores["context_recall"] == 1.0  # its one statement was read
    assert out[0].meta["judge_calls"] == 3 + 1 + 1  # 3 contexts, 1 retry, 1 statement
    for metric in METRICS[:2]:
        assert out[1].scores[metric] is None
        assert out[1].meta[f"{metric}_note"] == "closed_book records no retrieved contexts"
        assert out[2].scores[metric] is None and out[2].meta[f"{metric}_note"] == "no gold answers"
        assert out[3].scores[metric] is None
        assert "contexts unavailable" in out[3].meta[f"{metric}_note"]
    assert all("judge_calls" not in r.meta for r in out[1:])  # nothing was asked


def test_a_failed_judge_call_leaves_the_metric_missing_for_a_rerun():
    def judge_fn(request):
        raise RuntimeError("judge server fell over")

    _, judge = make_judge(judge_fn, METRICS, embedder=get_embedder("hash"))
    [out] = judge_records(labelled_items()[:1], METRICS, judge, read)
    for metric in METRICS:
        assert metric not in out.scores
        assert "fell over" in out.meta[f"{metric}_note"]


# ---------------------------------------------------------------------------- config


def test_config_needs_a_judge_and_takes_prompts_and_questions(tmp_path):
    cfg = run_config(tmp_path, strategies=["closed_book", "rag"])
    assert load_config(cfg).judge.questions == 3
    with pytest.raises(ConfigError, match="need a judge model"):
        load_config({**cfg, "judge": None})
    bad = {**cfg["judge"], "prompts": {"context_recall": "context-precision-v1"}}
    with pytest.raises(ConfigError, match="scores context_precision, not context_recall"):
        load_config({**cfg, "judge": bad})
    with pytest.raises(ConfigError, match="questions"):
        load_config({**cfg, "judge": {**cfg["judge"], "questions": 0}})
    # the default is left out of the hash (configs written before it keep their run folder)
    three = load_config({**cfg, "judge": {**cfg["judge"], "questions": 3}})
    five = load_config({**cfg, "judge": {**cfg["judge"], "questions": 5}})
    assert config_hash(three) == config_hash(load_config(cfg)) != config_hash(five)


# ---------------------------------------------------------------------------- in a run

FACTS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid")]
PIPELINE = '''
FACTS = {facts!r}


def answer(question):
    """Contexts: the question's country first, except for Italy (a useless one ranks first)."""
    country = question.rstrip("?").rsplit(" ", 1)[-1]
    right = "The capital of " + country + " is " + FACTS[country] + "."
    wrong = "The river of " + country + " is long."
    contexts = [wrong, right] if country == "Italy" else [right, wrong]
    return {{"answer": FACTS[country], "contexts": contexts}}
'''


def run_config(tmp_path, **over):
    from ragbench.datasets.formats import write_examples

    examples = []
    for i, (country, capital) in enumerate(FACTS):
        filler = " ".join(f"w{i}x{j}" for j in range(60))
        text = f"{filler}. The capital of {country} is {capital}. {filler}."
        examples.append(
            Example(
                f"q{i}",
                f"What is the capital of {country}?",
                (capital,),
                (Document(f"d{i}", text),),
            )
        )
    path = tmp_path / "qa.jsonl"
    write_examples(path, examples)
    cfg = {
        "name": "t-context-metrics",
        "dataset": {"name": "file", "params": {"path": str(path)}},
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 32,
            "chunk_overlap": 4,
            "tokenizer": "whitespace",
        },
        "strategies": [
            "closed_book",
            {"name": "rag", "params": {"top_k": 2, "order": "document"}},
            {"name": "pipeline", "params": {"target": "ctxpipe:answer"}},
        ],
        "metrics": ["string_match_all", "context_precision", "context_recall"],
        "price_sheet": "example-hosted-api",
        "judge": {
            "model": {"backend": "fake", "name": "judge-fake", "cache": False},
            "price_sheet": "example-hosted-api",
        },
        "output_dir": str(tmp_path / "results"),
    }
    return cfg | over


def gold_judge(request):
    """USEFUL / SUPPORTED when the passage(s) name the reference answer (the statement)."""
    gold = re.search(r"Reference answer\(s\): (.*)", request.prompt)[1]
    if "Retrieved passage:" in request.prompt:
        return "Verdict: USEFUL" if gold in passage(request.prompt) else "Verdict: USELESS"
    return "Verdict: SUPPORTED" if gold in passage(request.prompt) else "Verdict: UNSUPPORTED"


def test_a_run_with_a_pipeline_and_rag_fills_them_and_a_rerun_asks_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "ctxpipe.py").write_text(PIPELINE.format(facts=dict(FACTS)))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "ctxpipe", raising=False)
    model_prompts, passages = {}, []

    def model(request):
        model_prompts[request.id] = request.prompt
        return answer_from_prompt(request.prompt)

    def judge_fn(request):
        passages.append(passage(request.prompt))
        return gold_judge(request)

    inner = FakeLLM("judge-fake", answer_fn=judge_fn)
    cache = tmp_path / "judge-cache.sqlite"
    df = ragbench.run(
        run_config(tmp_path),
        progress=False,
        llm=FakeLLM(answer_fn=model),
        judge_llm=CachedLLM(inner, cache),
    )
    by = df.set_index(["strategy", "example_id"])
    # the pipeline: Italy's useful context ranks second (AP 1/2), the others first (AP 1)
    pipe = by.loc["pipeline"]
    assert pipe["context_precision"].to_dict() == {"q0": 1.0, "q1": 0.5, "q2": 1.0}
    assert (pipe["context_recall"] == 1.0).all()
    assert pipe["context_precision_verdicts"].map(lambda v: [list(s) for s in v]).to_dict() == {
        "q0": [[1, 0]],
        "q1": [[0, 1]],
        "q2": [[1, 0]],
    }
    # closed book read no contexts: unscored, said why
    closed = by.loc["closed_book"]
    assert closed["context_precision"].isna().all() and closed["context_recall"].isna().all()
    assert (closed["context_recall_note"] == "closed_book records no retrieved contexts").all()
    # the built-in RAG: its chunks rebuilt from the index, each one exactly in the model's prompt;
    # order: document puts the gold chunk second there, the judge reads them in rank order
    rag = by.loc["rag"]
    assert (rag["context_precision"] == 1.0).all() and (rag["context_recall"] == 1.0).all()
    for eid, row in rag.iterrows():
        prompt = model_prompts[f"{eid}:rag"]
        assert prompt.index("[2]") < prompt.index("The capital of")  # gold second in the prompt
        assert [list(v) for v in row["context_precision_verdicts"]] == [[1, 0]]  # first by rank
        judged = {p for p in passages if f"] {p}" in prompt}  # cited chunks: "[1] text"
        assert len(row["retrieved"]) == 2 and len(judged) == 2
    assert (df.loc[df["strategy"] != "closed_book", "judge_calls"] > 0).all()
    assert df.loc[df["strategy"] == "closed_book", "judge_calls"].isna().all()
    assert df["dollars"].notna().all() and (df["judge_dollars"].dropna() > 0).all()
    run_dir = tmp_path / "results" / df.attrs["run_dir"].split("/")[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["judge"]["prompts"] == {
        "context_precision": "context-precision-v1",
        "context_recall": "context-recall-v1",
    }
    agreement = {r["metric"]: r for r in manifest["judge"]["agreement"]}
    assert set(agreement) == {"context_precision", "context_recall"}
    assert agreement["context_precision"]["n_scored"] == 6  # rag and pipeline rows
    assert agreement["context_precision"]["n_unscored"] == 3  # closed book

    # another run folder, the same completion cache: not one judge call
    inner2 = FakeLLM("judge-fake", answer_fn=judge_fn)
    again = ragbench.run(
        run_config(tmp_path, output_dir=str(tmp_path / "other")),
        progress=False,
        judge_llm=CachedLLM(inner2, cache),
    )
    assert inner2.calls == 0
    cols = ["context_precision", "context_recall", "judge_calls", "judge_prompt_tokens"]
    pd.testing.assert_frame_equal(again[cols], df[cols])


@pytest.mark.slow
def test_embedded_judge_reports_agreement_across_samples(tmp_path):
    """SmolLM2-135M judges the RAG contexts of two questions twice (temperature 0.7): each score
    is a verdict in [0, 1] or unscored with a note, and the agreement across the two samples is
    reported per context, with the small-judge warning."""
    cfg = run_config(
        tmp_path,
        strategies=[{"name": "rag", "params": {"top_k": 2}}],
        metrics=["string_match_all", "context_precision"],
    )
    cfg["dataset"] = {**cfg["dataset"], "limit": 2}
    cfg["judge"] = {
        "model": {
            "backend": "hf",
            "name": "smollm2-135m-instruct",
            "max_new_tokens": 6,
            "cache": False,
        },
        "samples": 2,
        "temperature": 0.7,
        "max_attempts": 2,
    }
    df = ragbench.run(cfg, progress=False, llm=FakeLLM())
    assert len(df) == 2
    for _, row in df.iterrows():
        score = row["context_precision"]
        assert 0.0 <= score <= 1.0 or isinstance(row["context_precision_note"], str)
        assert len(row["context_precision_verdicts"]) == 2  # two samples, each over 2 contexts
        assert row["judge_calls"] >= 4 and row["judge_prompt_tokens"] > 0
    row = judge_agreement(df).set_index("metric").loc["context_precision"]
    assert row.judge_model == "smollm2-135m-instruct" and row.n_scored + row.n_unscored == 2
    assert row.n_fleiss <= 4 and (row.n_fleiss == 0 or row.samples == 2)
    assert any(
        w.startswith("context_precision: the judge is the small embedded model")
        for w in df.attrs["judge_warnings"]
    )
