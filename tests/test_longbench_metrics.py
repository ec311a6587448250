"""LongBench's official metrics, per subset: exact values checked against THUDM/LongBench's
``metrics.py`` (run on these cases with its own imports: ``rouge`` 1.0.1, ``fuzzywuzzy`` 0.18,
``jieba``); ROUGE-L is rouge-score's and its values are derived by hand here."""

from __future__ import annotations

import pytest

from ragbench.metrics import longbench as lb
from ragbench.metrics.answer import METRICS, score

# (function, prediction, gold, all_classes, value from LongBench's own metrics.py)
REFERENCE = [
    # normalised tokens: pred 8, gold 2, 2 shared: P=1/4 R=1 -> 0.4
    ("qa_f1_score", "The Lakeside Observatory was founded by Margaret Hale.", "Margaret Hale",
     None, 0.4444444444444445),
    ("qa_f1_score", "an apple a day", "apple pie", None, 0.5),
    ("qa_f1_zh_score", "北京是中国的首都。", "中国的首都是北京", None, 1.0),
    ("classification_score", "Type: Location and Numeric", "Numeric",
     ["Location", "Numeric", "Num"], 0.5),
    ("classification_score", "person name", "person", ["person", "person name", "name"],
     1 / 3),
    # LongBench removes from the list it iterates: "a" goes, "ab" is skipped over and stays
    ("classification_score", "abc", "abc", ["a", "ab", "abc"], 0.5),
    ("count_score", "There are 7 unique paragraphs out of 12.", "7", None, 0.5),
    ("count_score", "no idea", "7", None, 0.0),
    ("retrieval_score", "Paragraph 3 and maybe paragraph 12", "Paragraph 3", None, 0.5),
    ("retrieval_zh_score", "答案是段落5", "段落5", None, 1.0),
    # the first line that is not a code fence or comment is compared
    ("code_sim_score", "```python\n    return self.value + 1\n", "    return self.value", None,
     0.91),
    ("code_sim_score", "# comment\nx = compute(a, b)", "x = compute(a, c)", None, 0.94),
    ("code_sim_score", "return foo(bar)", "return bar(foo)", None, 0.73),
    ("code_sim_score", "", "", None, 1.0),
]  # fmt: skip


@pytest.mark.parametrize(("name", "pred", "gold", "classes", "expected"), REFERENCE)
def test_functions_match_longbench(name, pred, gold, classes, expected):
    assert lb.FUNCTIONS[name](pred, gold, all_classes=classes) == pytest.approx(expected, abs=1e-12)


def test_rouge_l_is_rouge_score_f_measure():
    # 6 tokens each, LCS "the cat on the mat" = 5: P = R = 5/6 (LongBench's `rouge`, counting
    # distinct words, gives 0.8 here: the documented deviation)
    assert lb.rouge_score("the cat sat on the mat", "the cat was on the mat") == pytest.approx(
        5 / 6
    )
    # rouge-score lowercases and drops punctuation; LCS 2 of pred 2, gold 4: F = 2*1*.5/1.5
    assert lb.rouge_score("Budget, approved.", "the budget was approved") == pytest.approx(2 / 3)
    assert lb.rouge_score("", "anything") == 0.0
    # Chinese: jieba words, not dropped as non-ASCII
    assert lb.rouge_zh_score("会议讨论了预算", "会议讨论了预算") == 1.0
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
