"""LongBench's official metrics, per subset: exact values checked against THUDM/LongBench's
``metrics.py`` (run on these cases with its own imports: ``rouge`` 1.0.1, ``fuzzywuzzy`` 0.18,
``jieba``). ROUGE-L is checked against LongBench's own wrapper of the ``rouge`` package, run as
LongBench runs it (a script: ``eval.py``'s module -> ``scorer`` -> the metric), on edge cases and
on seeded random pairs."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from ragbench.metrics import longbench as lb
from ragbench.metrics.answer import METRICS, score

# (function, prediction, gold, all_classes, value from LongBench's own metrics.py)
REFERENCE = [
    # normalised tokens: pred 8, gold 2, 2 shared: P=1/4 R=1 -> 0.4
    (
        "qa_f1_score",
        "The Lakeside Observatory was founded by Margaret Hale.",
        "Margaret Hale",
        None,
        0.4444444444444445,
    ),
    ("qa_f1_score", "an apple a day", "apple pie", None, 0.5),
    ("qa_f1_zh_score", "北京是中国的首都。", "中国的首都是北京", None, 1.0),
    (
        "classification_score",
        "Type: Location and Numeric",
        "Numeric",
        ["Location", "Numeric", "Num"],
        0.5,
    ),
    ("classification_score", "person name", "person", ["person", "person name", "name"], 1 / 3),
    # LongBench removes from the list it iterates: "a" goes, "ab" is skipped over and stays
    ("classification_score", "abc", "abc", ["a", "ab", "abc"], 0.5),
    ("count_score", "There are 7 unique paragraphs out of 12.", "7", None, 0.5),
    ("count_score", "no idea", "7", None, 0.0),
    ("retrieval_score", "Paragraph 3 and maybe paragraph 12", "Paragraph 3", None, 0.5),
    ("retrieval_zh_score", "答案是段落5", "段落5", None, 1.0),
    # the first line that is not a code fence or comment is compared
    (
        "code_sim_score",
        "```python\n    return self.value + 1\n",
        "    return self.value",
        None,
        0.91,
    ),
    ("code_sim_score", "# comment\nx = compute(a, b)", "x = compute(a, c)", None, 0.94),
    ("code_sim_score", "return foo(bar)", "return bar(foo)", None, 0.73),
    ("code_sim_score", "", "", None, 1.0),
]


@pytest.mark.parametrize(("name", "pred", "gold", "classes", "expected"), REFERENCE)
def test_functions_match_longbench(name, pred, gold, classes, expected):
    assert lb.FUNCTIONS[name](pred, gold, all_classes=classes) == pytest.approx(expected, abs=1e-12)


# The oracle: THUDM/LongBench, LongBench/metrics.py (``rouge_score``, ``rouge_zh_score``) copied
# as written, called the way LongBench/eval.py calls a metric (module level -> scorer -> metric),
# in its own interpreter, so the recursion budget is the one LongBench's scores are made with.
LONGBENCH_ORACLE = """
import json, sys
import jieba
from rouge import Rouge

def rouge_score(prediction, ground_truth, **kwargs):
    rouge = Rouge()
    try:
        scores = rouge.get_scores([prediction], [ground_truth], avg=True)
    except:
        return 0.0
    return scores["rouge-l"]["f"]

def rouge_zh_score(prediction, ground_truth, **kwargs):
    prediction = " ".join(list(jieba.cut(prediction, cut_all=False)))
    ground_truth = " ".join(list(jieba.cut(ground_truth, cut_all=False)))
    score = rouge_score(prediction, ground_truth)
    return score

dataset2metric = {"rouge_score": rouge_score, "rouge_zh_score": rouge_zh_score}

def scorer(dataset, predictions, answers):
    out = []
    for (prediction, ground_truth) in zip(predictions, answers):
        out.append(dataset2metric[dataset](prediction, ground_truth))
    return out

pairs = json.load(sys.stdin)
scores = {}
for name, rows in pairs.items():  # a loop at module level, as eval.py's (not a comprehension,
    predictions, answers = [p for p, _ in rows], [g for _, g in rows]  # a frame of its own)
    scores[name] = scorer(name, predictions, answers)
print(json.dumps(scores))
"""


def longbench_oracle(pairs: dict[str, list[tuple[str, str]]]) -> dict[str, list[float]]:
    jieba_quiet = "import jieba, logging; jieba.setLogLevel(logging.WARNING)\n"
    out = subprocess.run(
        [sys.executable, "-c", jieba_quiet + LONGBENCH_ORACLE],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


WORDS = [
    "the",
    "The",
    "cat",
    "cat.",
    "cat,",
    "sat",
    "on",
    "mat",
    "a",
    "A",
    "budget",
    "approved",
    "٣",
    "café",
    "naïve",
    "Zürich",
    "😀",
    "—",
    "...",
    ".",
    ",",
    "!",
    "?",
    "(x)",
    "e.g.",
    "3.14",
    "U.S.",
    "don't",
    "会议",
    "預算",
    "x",
    "y",
    "x",
    "x",
]
ZH = [
    "会议",
    "讨论",
    "了",
    "预算",
    "问题",
    "明年",
    "的",
    "我们",
    "，",
    "。",
    "北京",
    "2024",
    "AI",
    "成本",
    "模型",
    "检索",
    " ",
    ".",
]


def random_text(rng: random.Random, vocab: list[str], joiner: str) -> str:
    roll = rng.random()
    if roll < 0.06:
        return rng.choice(["", " ", ".", "..", " . ", "\n", "\t"])
    n = rng.choice([1, 2, 3, 5, 8, 13, 30, 80])
    words = [rng.choice(vocab) for _ in range(n)]
    if roll < 0.15:  # repeated tokens
        words = [words[0]] * n
    text = joiner.join(words)
    seps = ["", "  ", "\n", "\t", ". "]
    return "".join(c + (rng.choice(seps) if rng.random() < 0.05 else "") for c in text)


def random_pairs(seed: int, n: int) -> dict[str, list[tuple[str, str]]]:
    rng = random.Random(seed)
    en = [(random_text(rng, WORDS, " "), random_text(rng, WORDS, " ")) for _ in range(n)]
    zh = [(random_text(rng, ZH, ""), random_text(rng, ZH, "")) for _ in range(n // 4)]
    # near-copies: the prediction is the gold with a few words changed
    for _ in range(n // 4):
        gold = random_text(rng, WORDS, " ")
        en.append((" ".join(w if rng.random() < 0.8 else "cat." for w in gold.split(" ")), gold))
    return {"rouge_score": en, "rouge_zh_score": zh}


EDGE_CASES = [
    ("٣", "٣"),  # non-ASCII is kept: 1 (rouge-score drops it: 0)
    ("The cat.", "the cat"),  # case and punctuation stay in the tokens: 0.5
    ("", "the cat"),  # the package's "Hypothesis is empty" error: 0
    ("the cat", ""),
    ("", ""),
    ("...", "the cat"),  # no sentence left after splitting at ".": an error, 0
    ("cat cat cat", "cat"),  # lengths count distinct words: 1
    ("the cat sat on the mat", "the cat was on the mat"),
    ("Budget, approved.", "the budget was approved"),
]


def test_rouge_l_edge_cases_equal_longbench():
    expected = longbench_oracle({"rouge_score": EDGE_CASES})["rouge_score"]
    got = [lb.rouge_score(p, g) for p, g in EDGE_CASES]
    assert got == pytest.approx(expected, abs=1e-6)
    assert got[0] == pytest.approx(1.0, abs=1e-6) and got[1] == pytest.approx(0.5, abs=1e-6)
    assert got[2] == 0.0 and got[5] == 0.0 and got[6] == pytest.approx(1.0, abs=1e-6)


def test_rouge_l_equals_longbench_on_random_pairs():
    pairs = random_pairs(seed=20240611, n=2000)
    expected = longbench_oracle(pairs)
    for name, rows in pairs.items():
        got = [lb.FUNCTIONS[name](p, g) for p, g in rows]
        diffs = [
            (r, a, b)
            for r, a, b in zip(rows, got, expected[name], strict=True)
            if abs(a - b) > 1e-6
        ]
        assert not diffs, f"{name}: {len(diffs)} of {len(rows)} differ, e.g. {diffs[:3]}"
    assert len(pairs["rouge_score"]) == 2500 and len(pairs["rouge_zh_score"]) == 500


def test_rouge_l_recursion_limit_is_longbench_s_whatever_the_call_depth():
    # "zzz" and n more words against "zzz": the package's recursive LCS goes n frames
    # deep, so LongBench scores 0 past its recursion budget; the boundary must be the same here
    rows = [("zzz " + " ".join(f"w{i}" for i in range(n)), "zzz") for n in range(970, 1000)]
    expected = longbench_oracle({"rouge_score": rows})["rouge_score"]
    assert 0.0 in expected and any(v > 0 for v in expected)  # the boundary is inside the range

    def deeper(k: int) -> list[float]:
        return deeper(k - 1) if k else [lb.rouge_score(p, g) for p, g in rows]

    for depth in (0, 50, 200):
        assert deeper(depth) == pytest.approx(expected, abs=1e-6)
    assert sys.getrecursionlimit() == 1000 or sys.getrecursionlimit() > 1000  # restored


def test_rouge_zh_cuts_words_with_jieba():
    assert lb.rouge_zh_score("会议讨论了预算", "会议讨论了预算") == pytest.approx(1.0, abs=1e-6)
    assert 0 < lb.rouge_zh_score("会议讨论了预算问题", "会议讨论了明年的预算") < 1


def test_every_subset_has_a_function_and_longbench_e_names_map_back():
    assert set(lb.SUBSET_METRIC.values()) == set(lb.FUNCTIONS)
    assert lb.subset_name("hotpotqa_e") == "hotpotqa" and lb.subset_name("lcc_e") == "lcc"
    assert lb.subset_name("hotpotqa") == "hotpotqa" and lb.subset_name("toy_e") == "toy_e"


def test_longbench_metric_dispatches_on_meta():
    metric = METRICS.get("longbench")
    assert metric.needs_meta and metric.higher_is_better
    trec = {"dataset": "trec", "metric": "classification_score", "all_classes": ["Num", "Loc"]}
    # trec scores the first line only (eval.py): the second line's class does not count
    assert metric("Loc\nNum", ["Loc"], trec) == 1.0
    assert metric("Num\nLoc", ["Loc"], trec) == 0.0
    # max over the gold answers
    qa = {"dataset": "hotpotqa", "metric": "qa_f1_score"}
    assert metric("Margaret Hale", ["Hale Observatory", "Margaret Hale"], qa) == 1.0
    assert score("Margaret Hale", ["Margaret Hale"], ["longbench", "f1"], qa) == {
        "longbench": 1.0,
        "f1": 1.0,
    }
    count = {"dataset": "passage_count_e", "metric": "count_score"}
    assert metric("7 or 8", ["7"], count) == 0.5
    with pytest.raises(ValueError, match=r"needs the example's meta\['metric'\]"):
        metric("x", ["x"], None)
    with pytest.raises(ValueError, match="got 'bleu'"):
        metric("x", ["x"], {"metric": "bleu"})
