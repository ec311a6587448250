"""Judge metrics: reply parsing and retries, the judge pass in a run (cache, cost separation,
unreachable judge, rebuilt contexts), semantic similarity, and the agreement numbers (kappa)."""

from __future__ import annotations

import json
import math
import random
import re

import pandas as pd
import pytest
import yaml
from openai_server import send_json, serving, status
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.runner import run
from ragbench.judge import (
    Judge,
    cohen_kappa,
    fleiss_kappa,
    judge_agreement,
    judge_records,
    judge_warnings,
    load_prompt,
    parse_verdict,
)
from ragbench.llm.base import ServerUnreachable
from ragbench.llm.cache import CachedLLM
from ragbench.llm.fake import FakeLLM
from ragbench.strategies.params import ClosedBookParams
from ragbench.types import Document, Example, Record

LABELS = {"CORRECT": 1, "INCORRECT": 0}


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Verdict: CORRECT", 1),
        ("Verdict: INCORRECT", 0),
        ("verdict: correct\nThe values match.", 1),
        ("**Verdict:** Incorrect", 0),
        ('Verdict = "CORRECT"', 1),
        ("CORRECT.", 1),  # a bare label as the first word (prompt primed with "Verdict:")
        ("incorrect - it names 42", 0),
        ("Verdict: CORRECT\nVerdict: CORRECT", 1),  # repeated, agreeing
    ],
)
def test_parse_well_formed(reply, expected):
    assert parse_verdict(reply, LABELS) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "The answer is correct.",  # a label not in the verdict position
        "Verdict: CORRECT\nVerdict: INCORRECT",  # two different verdicts
        "Verdict: maybe",
        "Yes",
        "INCORRECTLY stated",  # labels are whole words
    ],
)
def test_parse_malformed_is_none_not_zero(reply):
    assert parse_verdict(reply, LABELS) is None


def test_shipped_prompts_and_unknown_name():
    correct, faithful = load_prompt("correct-v1"), load_prompt("faithful-v1")
    assert (correct.metric, faithful.metric) == ("judge_correct", "judge_faithful")
    text = correct.render(question="Q?", answers="a | b", prediction="b")
    assert "Question: Q?" in text and "Reference answer(s): a | b" in text
    assert "Attempt" not in text and "Attempt 2" in correct.render(
        2, question="", answers="", prediction=""
    )
    assert faithful.parse("Verdict: UNFAITHFUL") == 0 and faithful.parse("Verdict: FAITHFUL") == 1
    with pytest.raises(ValueError, match="did you mean 'correct-v1'"):
        load_prompt("corect-v1")


# ---------------------------------------------------------------------------- judge_records


def example(i=0, answers=("Paris",)):
    doc = Document(id=f"d{i}", text=f"The capital of France is Paris. Filler {i}.")
    return Example(
        id=f"e{i}", question="What is the capital of France?", answers=answers, documents=(doc,)
    )


def record(ex, prediction="Paris", scores=None):
    return Record(
        example_id=ex.id,
        strategy="closed_book",
        params=ClosedBookParams(),
        prediction=prediction,
        answers=ex.answers,
        scores=scores or {},
    )


def judge_with(answer_fn, **kw):
    llm = FakeLLM("judge-fake", answer_fn=answer_fn)
    prompts = {m: load_prompt(p) for m, p in (("judge_correct", "correct-v1"),)}
    return llm, Judge(llm=llm, prompts=prompts, model="judge-fake", **kw)


def test_malformed_reply_is_retried_then_unscored():
    llm, judge = judge_with(lambda r: "Hmm, hard to say.", max_attempts=3)
    ex = example()
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert out.scores["judge_correct"] is None  # unscored, never 0
    assert out.meta["judge_correct_samples"] == [None]
    assert "unreadable after 3 attempts" in out.meta["judge_correct_note"]
    assert "hard to say" in out.meta["judge_correct_note"]
    assert out.meta["judge_calls"] == 3 and llm.calls == 3  # first try + two reminders
    assert out.cost is None  # the record's own cost is untouched


def test_retry_with_reminder_recovers():
    seen = []

    def answer(r):
        seen.append(r.prompt)
        return "Verdict: CORRECT" if "Attempt 2" in r.prompt else "sure thing"

    _, judge = judge_with(answer)
    ex = example()
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert out.scores["judge_correct"] == 1.0 and "judge_correct_note" not in out.meta
    assert len(seen) == 2 and seen[1].startswith(seen[0])  # the reminder is appended
    assert out.meta["judge_correct_prompt"] == "correct-v1"


def test_samples_are_distinct_requests_and_score_is_their_mean():
    def answer(r):  # samples 1 and 3 say correct, sample 2 not
        return "Verdict: INCORRECT" if "judgement 2." in r.system else "Verdict: CORRECT"

    with pytest.raises(ValueError, match="temperature > 0"):
        judge_with(answer, samples=3)
    llm, judge = judge_with(answer, samples=3, temperature=0.7)
    ex = example()
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert out.meta["judge_correct_samples"] == [1, 0, 1]
    assert out.scores["judge_correct"] == pytest.approx(2 / 3)


def test_no_gold_and_no_context_are_unscored_with_a_reason():
    _, judge = judge_with(lambda r: "Verdict: CORRECT")
    judge.prompts["judge_faithful"] = load_prompt("faithful-v1")
    ex = example(answers=())
    [out] = judge_records([(ex, record(ex))], ["judge_correct", "judge_faithful"], judge)
    assert out.scores == {"judge_correct": None, "judge_faithful": None}
    assert out.meta["judge_correct_note"] == "no gold answers"
    assert "no context" in out.meta["judge_faithful_note"]
    assert "judge_calls" not in out.meta  # nothing was asked


def test_failed_judge_call_leaves_metric_missing_for_a_retry():
    def answer(r):
        raise RuntimeError("judge server fell over")

    _, judge = judge_with(answer)
    ex = example()
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert "judge_correct" not in out.scores
    assert "fell over" in out.meta["judge_correct_note"]


def test_prompt_over_the_judge_window_is_unscored():
    llm, judge = judge_with(lambda r: "Verdict: CORRECT")
    llm.context_window = 40
    ex = example()
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert out.scores["judge_correct"] is None and "window is 40" in out.meta["judge_correct_note"]
    assert llm.calls == 0


def test_semantic_similarity_with_hash_embedder():
    from ragbench.retrieval.embedders.base import get_embedder

    judge = Judge(embedder=get_embedder("hash"))
    exs = [example(0), example(1), example(2), example(3, answers=())]
    preds = ["Paris", "the city of Paris", "", "Paris"]
    out = judge_records(
        [(e, record(e, p)) for e, p in zip(exs, preds, strict=True)], ["semantic_similarity"], judge
    )
    sims = [r.scores["semantic_similarity"] for r in out]
    assert sims[0] == pytest.approx(1.0)
    assert 0.0 < sims[1] < 1.0
    assert sims[2] == 0.0 and sims[3] is None
    assert out[3].meta["semantic_similarity_note"] == "no gold answers"


# ---------------------------------------------------------------------------- kappa


def test_fleiss_kappa_wikipedia_example():
    # Fleiss (1971) as worked on Wikipedia: 10 items, 14 raters, 5 categories -> 0.210
    counts = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    ratings = [[c for c, n in enumerate(row) for _ in range(n)] for row in counts]
    assert fleiss_kappa(ratings) == pytest.approx(0.2099, abs=1e-4)
    # binary by hand: P = (1 + 1 + 0) / 3, Pe = 0.5^2 + 0.5^2 -> (2/3 - 1/2) / (1/2) = 1/3
    assert fleiss_kappa([[1, 1], [0, 0], [1, 0]]) == pytest.approx(1 / 3)
    assert math.isnan(fleiss_kappa([[1, 1], [1, 1]]))  # one category: undefined, not 1
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa([[1, 0], [1]])


def test_cohen_kappa_matches_sklearn():
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(5, 40)
        a = [rng.randint(0, 1) for _ in range(n)]
        b = [x if rng.random() < 0.7 else 1 - x for x in a]
        if len(set(a) | set(b)) > 1:
            assert cohen_kappa(a, b) == pytest.approx(sklearn.cohen_kappa_score(a, b))
    # by hand: po = 3/4, pe = (2/4)(1/4) + (2/4)(3/4) = 1/2 -> 0.5
    assert cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))


def test_judge_agreement_table_and_warnings():
    preds = ["Paris", "Lyon", "paris", "Nice", "Paris!", "Rome"]
    judged = [1.0, 0.0, 1.0, 1.0, None, 0.0]  # the judge is wrong on "Nice"; one unscored
    samples = [[1, 1], [0, 0], [1, 1], [1, 0], [None, None], [0, 0]]
    df = pd.DataFrame(
        {
            "example_id": [f"e{i}" for i in range(6)],
            "prediction": preds,
            "answers": [["Paris"]] * 6,
            "error": [None] * 6,
            "judge_correct": judged,
            "judge_correct_samples": samples,
            "judge_model": ["big-judge"] * 6,
            "judge_correct_note": [None, None, None, None, "unreadable", None],
        }
    )
    row = judge_agreement(df).iloc[0]
    assert (row.n_scored, row.n_unscored, row.samples, row.n_fleiss) == (5, 1, 2, 5)
    assert row.n_unreadable == 1
    assert row.fleiss_kappa == pytest.approx(fleiss_kappa([[1, 1], [0, 0], [1, 1], [1, 0], [0, 0]]))
    em = [1, 0, 1, 0, 0]  # exact match of the five scored rows
    assert row.kappa_exact_match == pytest.approx(cohen_kappa([1, 0, 1, 1, 0], em))
    assert row.agree_exact_match == pytest.approx(4 / 5)
    warnings = judge_warnings(df)
    assert any("1 of 6 judgements could not be read" in w for w in warnings)
    small = df.assign(judge_model="smollm2-135m-instruct")
    assert any(
        "small embedded model" in w and "Cohen's kappa 0.62" in w for w in judge_warnings(small)
    )


# ---------------------------------------------------------------------------- in a run


def qa_config(tmp_path, **over):
    """Three questions over short documents; closed book, long context and RAG."""
    from ragbench.datasets.formats import write_examples

    facts = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid")]
    examples = []
    for i, (country, capital) in enumerate(facts):
        filler = " ".join(f"w{i}x{j}" for j in range(60))
        text = f"{filler}. The capital of {country} is {capital}. {filler}."
        examples.append(
            Example(
                id=f"q{i}",
                question=f"What is the capital of {country}?",
                answers=(capital,),
                documents=(Document(id=f"d{i}", text=text),),
            )
        )
    path = tmp_path / "qa.jsonl"
    write_examples(path, examples)
    cfg = {
        "name": "t-judge",
        "dataset": {"name": "file", "params": {"path": str(path)}},
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 32,
            "chunk_overlap": 4,
            "tokenizer": "whitespace",
        },
        "strategies": ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 1}}],
        "metrics": ["exact_match", "judge_correct", "judge_faithful", "semantic_similarity"],
        "price_sheet": "example-hosted-api",
        "judge": {
            "model": {"backend": "fake", "name": "judge-fake", "cache": False},
            "price_sheet": "example-hosted-api",
        },
        "output_dir": str(tmp_path / "results"),
    }
    cfg.update(over)
    return cfg


def scripted_judge(r):
    """Correct when the candidate names a gold answer; faithful when the answer is in the
    context (or the context is empty and the model said unanswerable)."""
    if "Reference answer(s):" in r.prompt:
        gold = re.search(r"Reference answer\(s\): (.*)", r.prompt)[1].split(" | ")
        cand = re.search(r"Candidate answer: (.*)", r.prompt)[1]
        return "Verdict: CORRECT" if any(g in cand for g in gold) else "Verdict: INCORRECT"
    context = r.prompt.split("<<<", 1)[1].split(">>>", 1)[0]
    answer = re.search(r"\nAnswer: (.*)", r.prompt)[1]
    return "Verdict: FAITHFUL" if answer in context else "Verdict: UNFAITHFUL"


def test_run_judge_pass_cost_separation_and_cache(tmp_path):
    base = run(qa_config(tmp_path, metrics=["exact_match"], judge=None), progress=False)
    inner = FakeLLM("judge-fake", answer_fn=scripted_judge, decode_tokens_per_second=5.0)
    judge_llm = CachedLLM(inner, tmp_path / "judge-cache.sqlite")
    df = run(qa_config(tmp_path), progress=False, judge_llm=judge_llm)
    assert inner.calls > 0
    # the strategy's cost per query is the same with and without a judge
    for col in ("prompt_tokens", "completion_tokens", "resource_seconds", "dollars", "llm_calls"):
        assert df[col].tolist() == base[col].tolist(), col
    assert (df["judge_prompt_tokens"] > 0).all() and (df["judge_dollars"] > 0).all()
    # one judge_correct + one judge_faithful call each; closed book has no context to judge
    assert df["judge_calls"].tolist() == [1 if s == "closed_book" else 2 for s in df["strategy"]]
    assert not df.attrs["judge_warnings"]  # a judge that agrees with exact match: nothing to say
    by = df.set_index("strategy")
    assert by.loc["closed_book", "judge_faithful"].isna().all()  # no context: unscored
    assert by.loc["rag", "judge_faithful"].eq(1.0).all()
    assert by.loc["long_context", "judge_correct"].eq(1.0).all()
    assert df["semantic_similarity"].between(0, 1).all()
    manifest = json.loads(
        (
            tmp_path / "results" / f"{df.attrs['run_dir'].split('/')[-1]}" / "manifest.json"
        ).read_text()
    )
    assert manifest["judge"]["prompts"] == {
        "judge_correct": "correct-v1",
        "judge_faithful": "faithful-v1",
    }
    assert {r["metric"] for r in manifest["judge"]["agreement"]} == {
        "judge_correct",
        "judge_faithful",
    }

    # second run, another run folder, the same completion cache: no judge calls at all
    inner2 = FakeLLM("judge-fake", answer_fn=scripted_judge, decode_tokens_per_second=5.0)
    again = run(
        qa_config(tmp_path, output_dir=str(tmp_path / "other")),
        progress=False,
        judge_llm=CachedLLM(inner2, tmp_path / "judge-cache.sqlite"),
    )
    assert inner2.calls == 0
    cols = ["judge_correct", "judge_faithful", "judge_prompt_tokens", "judge_dollars"]
    pd.testing.assert_frame_equal(again[cols], df[cols])

    # resume of the same folder: nothing to generate or judge; judge scores survive rescoring
    inner3 = FakeLLM("judge-fake", answer_fn=scripted_judge)
    resumed = run(qa_config(tmp_path), progress=False, judge_llm=inner3)
    assert inner3.calls == 0
    pd.testing.assert_frame_equal(resumed[cols], df[cols])


def test_faithful_judge_reads_the_context_the_model_read(tmp_path):
    """The rebuilt context is exactly the one in the strategy's prompt, truncation included."""
    model_prompts, judge_contexts = {}, {}

    def model(r):
        model_prompts[r.id] = r.prompt
        return "Paris"

    def judge(r):
        if "<<<" in r.prompt:
            q = re.search(r"\nQuestion: (.*)", r.prompt)[1]
            judge_contexts.setdefault(q, []).append(
                r.prompt.split("<<<\n", 1)[1].split("\n>>>", 1)[0]
            )
        return "Verdict: CORRECT" if "Reference" in r.prompt else "Verdict: UNFAITHFUL"

    strategies = [
        {"name": "long_context", "params": {"overflow": "truncate_middle"}},
        {"name": "rag", "params": {"top_k": 2}},
    ]
    cfg = qa_config(tmp_path, strategies=strategies, prompt_budget=60, metrics=["judge_faithful"])
    df = run(
        cfg,
        progress=False,
        llm=FakeLLM(answer_fn=model),
        judge_llm=FakeLLM("judge-fake", answer_fn=judge),
    )
    assert (df["truncated_tokens"].dropna() > 0).all()  # long context really was cut
    assert df["judge_faithful"].eq(0.0).all()
    for rid, prompt in model_prompts.items():
        question = re.search(r"\nQuestion: (.*)", prompt)[1]
        contexts = judge_contexts[question]
        assert any(prompt.startswith(c + "\n\n") for c in contexts), rid


def test_unreachable_judge_fails_before_the_run_starts(tmp_path):
    cfg = qa_config(tmp_path)
    cfg["judge"] = {
        "model": {
            "backend": "openai",
            "name": "judge",
            "params": {"base_url": "http://127.0.0.1:9/v1"},
        }
    }
    model = FakeLLM()
    with pytest.raises(ServerUnreachable, match="127.0.0.1:9"):
        run(cfg, progress=False, llm=model)
    assert model.calls == 0  # nothing was generated
    # and nothing is left: the refused run's folder held only its lock, so it was removed
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())


def test_config_requires_a_judge_and_not_the_model_under_test(tmp_path):
    with pytest.raises(ConfigError, match="need a judge model"):
        run(qa_config(tmp_path, judge=None), progress=False)
    same = {"model": {"backend": "fake", "name": "fake", "cache": False}}
    with pytest.raises(ConfigError, match="allow_model_under_test"):
        run(qa_config(tmp_path, judge=same), progress=False)
    allowed = {**same, "allow_model_under_test": True}
    df = run(qa_config(tmp_path, judge=allowed, metrics=["judge_correct"]), progress=False)
    # the fake model answers prompts it cannot read with "unanswerable": never a verdict
    assert df["judge_correct"].isna().all() and df["judge_correct_note"].notna().all()
    assert (df["judge_calls"] == 3).all()


@pytest.mark.slow
def test_embedded_model_judges_end_to_end(tmp_path):
    """SmolLM2-135M judges two records (few new tokens): a verdict or an unscored note each,
    the agreement table and the small-judge warning with its measured numbers."""
    cfg = qa_config(
        tmp_path,
        strategies=["long_context"],
        metrics=["exact_match", "judge_correct"],
        judge={
            "model": {
                "backend": "hf",
                "name": "smollm2-135m-instruct",
                "max_new_tokens": 6,
                "cache": False,
            },
            "max_attempts": 2,
        },
        dataset={"name": "file", "params": {"path": str(tmp_path / "qa.jsonl")}, "limit": 2},
    )
    qa_config(tmp_path)  # writes the dataset file
    df = run(cfg, progress=False, llm=FakeLLM())
    assert len(df) == 2
    for _, row in df.iterrows():
        assert row["judge_correct"] in (0.0, 1.0) or isinstance(row["judge_correct_note"], str)
        assert row["judge_calls"] >= 1 and row["judge_prompt_tokens"] > 0
    table = judge_agreement(df)
    assert table.iloc[0]["judge_model"] == "smollm2-135m-instruct"
    assert any("small embedded model" in w for w in df.attrs["judge_warnings"])


# ---------------------------------------------------------------------------- judge.repeats


def test_repeats_keep_their_mean_and_spread():
    def answer(r):  # repeats 1 and 3 say correct, repeat 2 not
        return "Verdict: INCORRECT" if "judgement 2." in r.system else "Verdict: CORRECT"

    _, judge = judge_with(answer, samples=3, temperature=0.7)
    ex = example()
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert out.meta["judge_correct_samples"] == [1, 0, 1]
    assert out.scores["judge_correct"] == pytest.approx(2 / 3)  # the per-item mean
    assert out.meta["judge_correct_spread"] == pytest.approx(math.sqrt(2) / 3)  # its sd
    # one repeat unreadable: the spread of the two read; one read: no spread to speak of
    for unread, spread in ((("judgement 3.",), 0.5), (("judgement 2.", "judgement 3."), None)):
        _, judge = judge_with(
            lambda r, unread=unread: "Hmm." if any(u in r.system for u in unread) else answer(r),
            samples=3,
            temperature=0.7,
            max_attempts=1,
        )
        [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
        assert out.meta["judge_correct_spread"] == (spread and pytest.approx(spread))
    # one judgement (repeats: 1): no spread column, as before
    _, judge = judge_with(answer)
    [out] = judge_records([(ex, record(ex))], ["judge_correct"], judge)
    assert "judge_correct_spread" not in out.meta and out.meta["judge_correct_samples"] == [1]


def test_repeat_agreement_of_a_table():
    from ragbench.judge import repeat_agreement

    samples = [[1, 1, 1], [0, 0, 0], [1, 0, 1], [1, 1, 1], [None, 1, 0], [0, 0, 0]]
    df = pd.DataFrame(
        {
            "example_id": [f"e{i}" for i in range(6)],
            "prediction": ["Paris"] * 6,
            "answers": [["Paris"]] * 6,
            "error": [None] * 6,
            "judge_correct": [1.0, 0.0, 2 / 3, 1.0, 0.5, 0.0],
            "judge_correct_samples": samples,
            "judge_model": ["big-judge"] * 6,
            "exact_match": [1.0] * 6,
        }
    )
    got = repeat_agreement(df, "judge_correct")
    full = [s for s in samples if None not in s]
    assert got["repeats"] == 3 and got["n_kappa"] == 5 and got["n_scored"] == 6
    assert got["kappa"] == pytest.approx(fleiss_kappa(full))
    assert got["differed"] == pytest.approx(2 / 6)  # [1, 0, 1] and the two read of [None, 1, 0]
    assert got["mean_spread"] == pytest.approx((math.sqrt(2) / 3 + 0.5) / 6)
    assert got["low"] is (got["kappa"] < 0.4) and got["judge_model"] == "big-judge"
    assert repeat_agreement(df, "exact_match") is None  # not judged
    once = df.assign(judge_correct_samples=[[s[-1]] for s in samples])
    assert repeat_agreement(once, "judge_correct") is None  # judged once: nothing to agree on


def test_repeat_agreement_words_and_low_warning():
    from ragbench.analysis.verdict_text import judge_text

    base = {
        "metric": "judge_correct",
        "repeats": 3,
        "kappa": 0.71,
        "n_kappa": 36,
        "n_scored": 36,
        "differed": 0.25,
        "mean_spread": 0.12,
        "low": False,
        "judge_model": "big-judge",
    }
    text = judge_text(base)
    assert text == (
        "judge_correct judged 3 times per answer by big-judge; agreement across the "
        "repeats Fleiss' kappa 0.71 (n=36); they differed on 25% of answers "
        "(mean spread 0.12)."
    )
    low = judge_text({**base, "kappa": 0.21, "low": True})
    assert "Fleiss' kappa 0.21" in low and "Low agreement (kappa below 0.4)" in low
    same = judge_text({**base, "kappa": math.nan, "differed": 0.0})
    assert "one verdict throughout (kappa undefined)" in same and "differed" not in same


def noisy_judge(r):
    """``scripted_judge`` that, at temperature > 0, flips a quarter of its verdicts with an RNG
    seeded from the request (as the transformers backend seeds its sampling): each repeat is
    its own request, so the repeats differ, and the same request always answers the same."""
    import hashlib

    reply = scripted_judge(r)
    digest = hashlib.sha256(r.to_json().encode()).hexdigest()
    if r.temperature > 0 and random.Random(int(digest[:15], 16)).random() < 0.25:
        flip = {
            "Verdict: CORRECT": "Verdict: INCORRECT",
            "Verdict: INCORRECT": "Verdict: CORRECT",
            "Verdict: FAITHFUL": "Verdict: UNFAITHFUL",
            "Verdict: UNFAITHFUL": "Verdict: FAITHFUL",
        }
        reply = flip[reply]
    return reply


def test_run_with_judge_repeats_reports_mean_spread_agreement_and_the_verdict_cites_it(tmp_path):
    from ragbench.analysis.verdict import verdict

    judge = {
        "model": {"backend": "fake", "name": "judge-fake", "cache": False},
        "price_sheet": "example-hosted-api",
        "repeats": 3,
        "temperature": 0.7,
    }
    cfg = qa_config(tmp_path, judge=judge)
    df = run(cfg, progress=False, judge_llm=FakeLLM("judge-fake", answer_fn=noisy_judge))
    judged = df[df["judge_correct"].notna()]
    assert len(judged) == len(df)
    for _, row in judged.iterrows():  # the per-item mean and spread of the three repeats
        reps = [float(x) for x in row["judge_correct_samples"]]
        assert len(reps) == 3 and row["judge_correct"] == pytest.approx(sum(reps) / 3)
        assert row["judge_correct_spread"] == pytest.approx(float(pd.Series(reps).std(ddof=0)))
    assert "judge_faithful_spread" in df.columns
    assert df["judge_correct_spread"].gt(0).any()  # the noisy judge disagrees with itself
    assert df["judge_calls"].tolist() == [3 if s == "closed_book" else 6 for s in df["strategy"]]
    manifest = json.loads(
        (tmp_path / "results" / df.attrs["run_dir"].split("/")[-1] / "manifest.json").read_text()
    )
    assert manifest["judge"]["repeats"] == 3 and manifest["config"]["judge"]["repeats"] == 3
    row = next(r for r in manifest["judge"]["agreement"] if r["metric"] == "judge_correct")
    assert row["samples"] == 3

    v = verdict(df, metric="judge_correct")
    cited = v.conditions["judge"]
    assert cited["repeats"] == 3 and cited["metric"] == "judge_correct"
    assert cited["n_kappa"] == len(df)
    kappa = f"Fleiss' kappa {cited['kappa']:.2f}" if cited["kappa"] == cited["kappa"] else ""
    assert "judge_correct judged 3 times per answer by judge-fake" in v.conditions_text
    assert kappa in v.conditions_text and "judge_correct judged 3" in str(v)
    assert "judged" not in verdict(df, metric="exact_match").conditions_text  # not judged

    # seeded: a fresh judge (no cache) in another run folder makes the same judgements
    again = run(
        qa_config(tmp_path, judge=judge, output_dir=str(tmp_path / "other")),
        progress=False,
        judge_llm=FakeLLM("judge-fake", answer_fn=noisy_judge),
    )
    cols = ["judge_correct", "judge_correct_spread", "judge_faithful", "judge_faithful_spread"]
    pd.testing.assert_frame_equal(again[cols], df[cols])


def test_run_with_one_repeat_is_as_before(tmp_path):
    from ragbench.analysis.verdict import verdict

    df = run(
        qa_config(tmp_path),
        progress=False,
        judge_llm=FakeLLM("judge-fake", answer_fn=scripted_judge),
    )
    assert not [c for c in df.columns if c.endswith("_spread")]
    v = verdict(df, metric="judge_correct")
    assert "judge" not in v.conditions and "judged" not in v.conditions_text


serve = pytest.fixture(serving, name="serve")


def test_records_a_failing_judge_left_unjudged_are_said_at_the_end(tmp_path, serve, caplog):
    # a judge server that answers 3 calls then returns HTTP 500: per-record warnings only, exit
    # 0, status finished, and the end of the run did not say 6 records were left unjudged
    def behave(h, body, n):
        if n >= 3:
            return status(500, "down")(h, body, n)
        msg = {"message": {"role": "assistant", "content": "CORRECT"}, "finish_reason": "stop"}
        use = {"prompt_tokens": 100, "completion_tokens": 2}
        return send_json(h, 200, {"model": body["model"], "choices": [msg], "usage": use})

    srv = serve(behave)
    judge = {
        "model": {
            "backend": "openai",
            "name": "m",
            "cache": False,
            "batch_size": 1,
            "params": {"base_url": srv.url, "max_retries": 0},
        }
    }
    cfg = qa_config(tmp_path, judge=judge, metrics=["exact_match", "judge_correct"])
    with caplog.at_level("WARNING"):
        df = run(cfg, progress=False)
    assert df["judge_correct"].notna().sum() == 3
    lines = [r.getMessage() for r in caplog.records if "not judged" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("6 of 9 records not judged (most frequent (6 x): judge_correct: ")
    assert "500" in lines[0] and lines[0].endswith("; rerun to retry")
    assert any("not judged" in w for w in df.attrs["judge_warnings"])
    # `ragbench run` says it after its summary; the rerun retries them (the server still fails)
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(cfg))
    again = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert again.exit_code == 0, again.output
    assert again.output.rstrip().splitlines()[-1].startswith("6 of 9 records not judged")
    assert len(srv.requests) == 3 + 6 + 6  # the six asked again
