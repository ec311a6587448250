"""SQuAD 2.0 scoring equals the official v2.0 evaluation script: per question (exact, F1) and the
HasAns / NoAns / total summary, on the edge cases where ragbench used to differ and on seeded
random datasets imported through ``load_squad``."""

from __future__ import annotations

import collections
import json
import random
import re
import string

import pytest

from ragbench.datasets import formats
from ragbench.metrics.answer import score
from ragbench.metrics.squad import (
    as_squad_prediction,
    has_answer,
    squad_v2_scores,
    squad_v2_summary,
)


def squad_v2_evaluate(examples: list, predictions: dict[str, str]) -> dict:
    """The official summary of ``predictions`` (question id -> text) on SQuAD 2.0 examples;
    a question without a prediction is left out, as the script does."""
    exact_scores, f1_scores, has = [], [], []
    for example in examples:
        if example.id not in predictions:
            continue
        answerable = has_answer(example.meta)
        scores = squad_v2_scores(predictions[example.id], example.answers, answerable)
        exact_scores.append(scores["exact_match"])
        f1_scores.append(scores["f1"])
        has.append(answerable)
    return squad_v2_summary(exact_scores, f1_scores, has)


# ---------------------------------------------------------------------------- the oracle
# SQuAD v2.0 official evaluation script, evaluate-v2.0.py
# (https://rajpurkar.github.io/SQuAD-explorer/): its functions as written (2-space indents
# re-indented), with main() reduced to the no-answer-probability-free path it takes by default.


def normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""

    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def make_qid_to_has_ans(dataset):
    qid_to_has_ans = {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid_to_has_ans[qa["id"]] = bool(qa["answers"])
    return qid_to_has_ans


def get_tokens(s):
    if not s:
        return []
    return normalize_answer(s).split()


def compute_exact(a_gold, a_pred):
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def get_raw_scores(dataset, preds):
    exact_scores = {}
    f1_scores = {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
                if not gold_answers:
                    # For unanswerable questions, only correct answer is empty string
                    gold_answers = [""]
                if qid not in preds:
                    print("Missing prediction for %s" % qid)  # noqa: UP031
                    continue
                a_pred = preds[qid]
                # Take max over all gold answers
                exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict(
            [
                ("exact", 100.0 * sum(exact_scores.values()) / total),
                ("f1", 100.0 * sum(f1_scores.values()) / total),
                ("total", total),
            ]
        )
    total = len(qid_list)
    return collections.OrderedDict(
        [
            ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
            ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
            ("total", total),
        ]
    )


def merge_eval(main_eval, new_eval, prefix):
    for k in new_eval:
        main_eval["%s_%s" % (prefix, k)] = new_eval[k]  # noqa: UP031


def official_eval(dataset, preds):
    qid_to_has_ans = make_qid_to_has_ans(dataset)  # maps qid to True/False
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = get_raw_scores(dataset, preds)
    out_eval = make_eval_dict(exact_raw, f1_raw)
    if has_ans_qids:
        has_ans_eval = make_eval_dict(exact_raw, f1_raw, qid_list=has_ans_qids)
        merge_eval(out_eval, has_ans_eval, "HasAns")
    if no_ans_qids:
        no_ans_eval = make_eval_dict(exact_raw, f1_raw, qid_list=no_ans_qids)
        merge_eval(out_eval, no_ans_eval, "NoAns")
    return out_eval, exact_raw, f1_raw


# ---------------------------------------------------------------------------- fixtures


def as_official(prediction: str) -> str:
    """What a SQuAD system would have output: ragbench's decline word is the empty answer."""
    return "" if normalize_answer(prediction) == "unanswerable" else prediction


def write_squad(tmp_path, qas: list[tuple[str, list[str]]], context: str):
    """A v2.0 file of one paragraph; each (qid, answer texts) is a question, [] unanswerable."""
    rows = []
    for qid, texts in qas:
        answers = [{"text": t, "answer_start": context.index(t)} for t in texts]
        rows.append(
            {"id": qid, "question": f"q {qid}?", "answers": answers, "is_impossible": not texts}
        )
    data = {
        "version": "v2.0",
        "data": [{"title": "T", "paragraphs": [{"context": context, "qas": rows}]}],
    }
    path = tmp_path / "squad2.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path, data["data"]


CONTEXT = "Paris is the capital. The answer is unanswerable here. A cat sat. The Nile, a river."


def ours_vs_official(tmp_path, qas, preds):
    path, dataset = write_squad(tmp_path, qas, CONTEXT)
    examples = formats.load("squad", path)
    official, exact_raw, f1_raw = official_eval(
        dataset, {q: as_official(p) for q, p in preds.items()}
    )
    ours = {e.id: score(preds[e.id], e.answers, ["exact_match", "f1"], e.meta) for e in examples}
    return examples, official, exact_raw, f1_raw, ours


# ---------------------------------------------------------------------------- edge cases


def test_the_listed_differences_now_score_as_the_official_script(tmp_path):
    qas = [
        ("none-empty", []),  # a prediction that normalises to empty declines
        ("none-punct", []),
        ("none-decline", []),
        ("none-hedge", []),  # "Paris, unanswerable" is an answer: wrong here
        ("has-hedge", ["Paris"]),  # ... and only partly right here (F1, not exact)
        ("gold-literal", ["unanswerable"]),  # an answer, not a no-answer question
        ("gold-empty", ["The"]),  # normalises to empty: scored against ""
        ("gold-empty-2", ["The"]),
        ("gold-mixed", ["The", "Nile"]),  # the empty-normalising gold is dropped
    ]
    preds = {
        "none-empty": "",
        "none-punct": " . ",
        "none-decline": "Unanswerable.",
        "none-hedge": "Paris, unanswerable",
        "has-hedge": "Paris, unanswerable",
        "gold-literal": "Paris",
        "gold-empty": "Paris",
        "gold-empty-2": "the",
        "gold-mixed": "",
    }
    examples, official, exact_raw, f1_raw, ours = ours_vs_official(tmp_path, qas, preds)
    for qid in preds:
        assert ours[qid]["exact_match"] == pytest.approx(exact_raw[qid], abs=1e-9), qid
        assert ours[qid]["f1"] == pytest.approx(f1_raw[qid], abs=1e-9), qid
    assert (
        ours["none-empty"]
        == ours["none-punct"]
        == ours["none-decline"]
        == {
            "exact_match": 1.0,
            "f1": 1.0,
        }
    )
    assert ours["none-hedge"] == {"exact_match": 0.0, "f1": 0.0}
    assert ours["has-hedge"]["exact_match"] == 0.0
    assert ours["has-hedge"]["f1"] == pytest.approx(2 / 3)
    assert ours["gold-empty"]["exact_match"] == 0.0 and ours["gold-empty-2"]["f1"] == 1.0
    assert ours["gold-mixed"] == {"exact_match": 0.0, "f1": 0.0}
    summary = squad_v2_evaluate(examples, preds)
    assert summary == pytest.approx(dict(official), abs=1e-9)
    # the literal gold "unanswerable" is an answerable question: 5 HasAns, 4 NoAns
    assert summary["HasAns_total"] == 5 and summary["NoAns_total"] == 4


def test_every_string_metric_asks_whether_a_no_answer_question_was_declined(tmp_path):
    path, _ = write_squad(tmp_path, [("a", ["Paris"]), ("n", [])], CONTEXT)
    answerable, impossible = formats.load("squad", path)
    assert impossible.meta["squad_v2"] is True and answerable.meta["squad_v2"] is True
    names = ["exact_match", "f1", "contains", "string_match_all", "string_match_part"]
    for declined in ("unanswerable", "Unanswerable.", "", "the"):
        assert score(declined, impossible.answers, names, impossible.meta) == dict.fromkeys(
            names, 1.0
        )
    for answer in ("Paris", "Unanswerable: the text does not say", "Paris, unanswerable"):
        assert score(answer, impossible.answers, names, impossible.meta) == dict.fromkeys(
            names, 0.0
        )
    assert score("It is Paris", answerable.answers, names, answerable.meta) == {
        "exact_match": 0.0,
        "f1": 0.5,  # 1 of 3 tokens, the 1 gold token
        "contains": 1.0,
        "string_match_all": 1.0,
        "string_match_part": 1.0,
    }
    # data imported before the squad_v2 marker (a v2 file: allow_decline) scores the same way
    legacy = {k: v for k, v in impossible.meta.items() if k != "squad_v2"}
    assert score("", impossible.answers, ["exact_match"], legacy) == {"exact_match": 1.0}
    # outside SQuAD 2.0 a gold "unanswerable" is a literal answer
    assert score("Unanswerable.", ("unanswerable",), ["exact_match"]) == {"exact_match": 1.0}
    assert score("", ("unanswerable",), ["exact_match", "f1"]) == {"exact_match": 0.0, "f1": 0.0}


def test_v1_files_keep_the_v1_script(tmp_path):
    data = {
        "version": "1.1",
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": CONTEXT,
                        "qas": [
                            {
                                "id": "q",
                                "question": "q?",
                                "answers": [{"text": "The", "answer_start": 22}],
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    [example] = formats.load("squad", path)
    assert "squad_v2" not in example.meta
    # v1.1: every gold counts, and F1 of empty token lists is 0
    assert score("", example.answers, ["exact_match", "f1"], example.meta) == {
        "exact_match": 1.0,
        "f1": 0.0,
    }


def test_summary_matches_the_script_and_checks_its_input():
    assert as_squad_prediction(" Unanswerable! ") == "" and as_squad_prediction("no") == "no"
    assert squad_v2_scores("unanswerable", ["Paris"], has_answer=True) == {
        "exact_match": 0.0,
        "f1": 0.0,
    }
    only_has = squad_v2_summary([1.0, 0.0], [1.0, 0.5], [True, True])
    assert only_has == {
        "exact": 50.0,
        "f1": 75.0,
        "total": 2,
        "HasAns_exact": 50.0,
        "HasAns_f1": 75.0,
        "HasAns_total": 2,
    }
    with pytest.raises(ValueError, match="one exact, f1 and has_answer per question"):
        squad_v2_summary([1.0], [1.0, 0.0], [True])
    with pytest.raises(ValueError, match="no questions"):
        squad_v2_summary([], [], [])


# ---------------------------------------------------------------------------- random datasets

SPANS = [
    "Paris",
    "the capital",
    "The answer is unanswerable",
    "unanswerable",
    "A cat",
    "cat sat",
    "The Nile",
    "a river",
    "Nile, a river.",
    "The",
    "A",
    ".",
    "is",
]
PREDICTIONS = [
    "",
    " ",
    ".",
    "the",
    "A",
    "unanswerable",
    "Unanswerable.",
    "UNANSWERABLE!",
    "Paris, unanswerable",
    "Unanswerable: the text does not say",
    "Paris",
    "paris.",
    "The capital",
    "capital Paris",
    "cat",
    "a cat sat",
    "The Nile, a river",
    "river Nile Nile",
    "Nile",
    "sat",
    "is",
    "The answer is unanswerable",
    "no answer",
    "Zürich",
    "٣",
]


def test_random_datasets_equal_the_official_script(tmp_path):
    rng = random.Random(20240611)
    n_questions, n_files = 0, 30
    for f in range(n_files):
        qas, preds = [], {}
        for i in range(100):
            qid = f"f{f}-q{i}"
            texts = [] if rng.random() < 0.4 else rng.sample(SPANS, rng.choice([1, 1, 2, 3]))
            qas.append((qid, texts))
            roll = rng.random()
            if texts and roll < 0.25:
                preds[qid] = rng.choice(texts)
            elif roll < 0.4:
                preds[qid] = " ".join(rng.sample(PREDICTIONS, 2))
            else:
                preds[qid] = rng.choice(PREDICTIONS)
        folder = tmp_path / f"f{f}"
        folder.mkdir()
        examples, official, exact_raw, f1_raw, ours = ours_vs_official(folder, qas, preds)
        for qid in preds:
            assert ours[qid]["exact_match"] == pytest.approx(exact_raw[qid], abs=1e-6), qid
            assert ours[qid]["f1"] == pytest.approx(f1_raw[qid], abs=1e-6), qid
        assert squad_v2_evaluate(examples, preds) == pytest.approx(dict(official), abs=1e-6)
        n_questions += len(preds)
    assert n_questions == 3000
