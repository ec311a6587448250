"""LongBench's official per-subset metrics, and the ``longbench`` metric that dispatches on them.

LongBench (THUDM/LongBench, ``metrics.py`` and ``eval.py``) scores every subset with its own
function; the importer (``datasets.importers.load_longbench``) records the function's name in
``meta["metric"]`` and this module reproduces the functions:

- ``qa_f1_score``: SQuAD-normalised token F1 (narrativeqa, qasper, multifieldqa_en, hotpotqa,
  2wikimqa, musique, triviaqa); ``qa_f1_zh_score``: jieba tokens, Chinese punctuation removed
  (multifieldqa_zh).
- ``rouge_score`` / ``rouge_zh_score``: ROUGE-L F (gov_report, qmsum, multi_news, samsum /
  dureader, vcsum; Chinese text is cut into words with jieba first, as LongBench does).
- ``classification_score``: the classes of ``all_classes`` named in the prediction; 1/n when the
  gold class is among the n named (trec, lsht).
- ``retrieval_score`` / ``retrieval_zh_score``: share of the numbers in the prediction that are
  the gold paragraph's number ("Paragraph 3" / "段落3") (passage_retrieval_en / _zh).
- ``count_score``: share of the numbers in the prediction equal to the gold count
  (passage_count).
- ``code_sim_score``: fuzzy ratio between the first line of the prediction that is not a comment
  or a code fence and the gold line (lcc, repobench-p).

As ``eval.py`` does, trec, triviaqa, samsum and lsht score only the prediction's first line, and
an example's score is the maximum over its gold answers. Scores are in [0, 1] (LongBench reports
100 x the mean).

ROUGE-L is LongBench's own: the ``rouge`` package (1.0.1, pltrdy) called exactly as LongBench's
``rouge_score`` wrapper calls it (``Rouge().get_scores([prediction], [ground_truth], avg=True)``,
``["rouge-l"]["f"]``; any error, such as an empty prediction, scores 0). Its quirks are kept:
tokens are split on spaces only (punctuation and case stay, so "The cat." vs "the cat" is 0.5),
text is cut into sentences at ".", lengths count distinct words, non-ASCII text is kept. Chinese
is cut into words with jieba and joined with spaces first (``rouge_zh_score``). The package's
LCS is recursive, so a very long sentence raises ``RecursionError``, which LongBench's bare
``except`` turns into 0; the call runs with the recursion budget it has under LongBench's
``eval.py`` (the default limit of 1000, three frames deep, four through ``rouge_zh_score``),
so where it fails there it fails here too, whatever the caller's stack depth.

One substitution, for a maintained package: code similarity uses ``rapidfuzz.fuzz.ratio``
rounded to an integer percent: what ``fuzzywuzzy.fuzz.ratio`` (LongBench's import) returns with
python-Levenshtein installed, and what its maintained successor ``thefuzz`` returns. Plain
fuzzywuzzy without python-Levenshtein falls back to difflib, whose ratio can differ slightly.

Everything else is a line-by-line reproduction, quirks included: ``classification_score``
removes from the list it iterates (so of two adjacent sub-string matches the second is kept),
and a prediction with no number scores 0 on count and retrieval.
"""

from __future__ import annotations

import contextlib
import re
import string
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from ragbench.metrics.normalize import normalize_answer

# subset -> official metric (LongBench eval.py ``dataset2metric``); LongBench-E names end in "_e"
SUBSET_METRIC = {
    "narrativeqa": "qa_f1_score",
    "qasper": "qa_f1_score",
    "multifieldqa_en": "qa_f1_score",
    "multifieldqa_zh": "qa_f1_zh_score",
    "hotpotqa": "qa_f1_score",
    "2wikimqa": "qa_f1_score",
    "musique": "qa_f1_score",
    "dureader": "rouge_zh_score",
    "gov_report": "rouge_score",
    "qmsum": "rouge_score",
    "multi_news": "rouge_score",
    "vcsum": "rouge_zh_score",
    "trec": "classification_score",
    "triviaqa": "qa_f1_score",
    "samsum": "rouge_score",
    "lsht": "classification_score",
    "passage_retrieval_en": "retrieval_score",
    "passage_count": "count_score",
    "passage_retrieval_zh": "retrieval_zh_score",
    "lcc": "code_sim_score",
    "repobench-p": "code_sim_score",
}
# eval.py scores only the first line of the prediction for these (few-shot subsets whose models
# go on to write the next example)
FIRST_LINE_SUBSETS = ("trec", "triviaqa", "samsum", "lsht")
RETRIEVAL_PATTERNS = {"retrieval_score": r"Paragraph (\d+)", "retrieval_zh_score": r"段落(\d+)"}


def subset_name(dataset: str) -> str:
    """The LongBench subset of a ``dataset`` field: LongBench-E's ``hotpotqa_e`` is hotpotqa."""
    return dataset[:-2] if dataset.endswith("_e") and dataset[:-2] in SUBSET_METRIC else dataset


# ---------------------------------------------------------------------------- the functions

_CN_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
_ALL_PUNCTUATION = set(string.punctuation + _CN_PUNCTUATION)


def normalize_zh_answer(s: str) -> str:
    """LongBench ``normalize_zh_answer``: lower, drop ASCII and Chinese punctuation and spaces."""
    return "".join("".join(ch for ch in s.lower() if ch not in _ALL_PUNCTUATION).split())


@cache
def _jieba() -> Any:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary load prints to stderr otherwise
    return jieba


def _cut(text: str) -> list[str]:
    return list(_jieba().cut(text, cut_all=False))


def _f1(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_: object) -> float:
    return _f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def qa_f1_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    pred = [t for t in (normalize_zh_answer(w) for w in _cut(prediction)) if t]
    gold = [t for t in (normalize_zh_answer(w) for w in _cut(ground_truth)) if t]
    return _f1(pred, gold)


# LongBench runs ``eval.py`` as a script: its ``rouge_score`` is three frames deep (the module,
# ``scorer``, ``rouge_score``) under Python's default recursion limit; ``rouge_zh_score`` adds one
LONGBENCH_RECURSION_LIMIT = 1000
_ROUGE_DEPTH = {"rouge_score": 3, "rouge_zh_score": 4}
_RECURSION_LOCK = threading.Lock()


def _frames_left() -> int:
    """How many nested Python calls still fit below the caller's frame."""
    depth = 0

    def down(n: int) -> None:
        nonlocal depth
        depth = n
        down(n + 1)

    with contextlib.suppress(RecursionError):
        down(1)
    return depth + 1  # this function's frame and the ``down`` frames that got in


def _rouge_l(prediction: str, ground_truth: str, caller: str) -> float:
    """LongBench's ``rouge_score`` wrapper, with the recursion budget it has in ``eval.py``
    (``caller`` names the LongBench function it runs under: see the module docstring)."""
    from rouge import Rouge

    rouge = Rouge()
    with _RECURSION_LOCK:
        limit = sys.getrecursionlimit()
        budget = LONGBENCH_RECURSION_LIMIT - _ROUGE_DEPTH[caller]  # frames below rouge_score
        sys.setrecursionlimit(limit + budget - _frames_left())
        try:
            scores = rouge.get_scores([prediction], [ground_truth], avg=True)
        except Exception:  # LongBench: a bare ``except`` (empty prediction, recursion) -> 0
            return 0.0
        finally:
            sys.setrecursionlimit(limit)
    return float(scores["rouge-l"]["f"])


def rouge_score(prediction: str, ground_truth: str, **_: object) -> float:
    """LongBench ``rouge_score``: ROUGE-L F of the ``rouge`` package (module docstring)."""
    return _rouge_l(prediction, ground_truth, "rouge_score")


def rouge_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """LongBench ``rouge_zh_score``: jieba words joined by spaces, then ``rouge_score``."""
    prediction, ground_truth = " ".join(_cut(prediction)), " ".join(_cut(ground_truth))
    return _rouge_l(prediction, ground_truth, "rouge_zh_score")


def classification_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    em_match_list = [c for c in kwargs["all_classes"] if c in prediction]
    # LongBench removes from the list while iterating over it; reproduced as written, since
    # iterating over a copy would change scores when two sub-string matches are adjacent
    for match_term in em_match_list:
        if match_term in ground_truth and match_term != ground_truth:
            em_match_list.remove(match_term)
    if ground_truth in em_match_list:
        return 1.0 / len(em_match_list)
    return 0.0


def _share_equal(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return 0.0 if not numbers else sum(n == target for n in numbers) / len(numbers)


def count_score(prediction: str, ground_truth: str, **_: object) -> float:
    return _share_equal(prediction, str(ground_truth))


def retrieval_score(prediction: str, ground_truth: str, **_: object) -> float:
    return _share_equal(
        prediction, re.findall(RETRIEVAL_PATTERNS["retrieval_score"], ground_truth)[0]
    )


def retrieval_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    target = re.findall(RETRIEVAL_PATTERNS["retrieval_zh_score"], ground_truth)[0]
    return _share_equal(prediction, target)


def fuzz_ratio(a: str, b: str) -> int:
    """``fuzzywuzzy.fuzz.ratio`` (with python-Levenshtein) / ``thefuzz.fuzz.ratio``: equal
    strings 100, an empty one 0, else the Indel similarity in percent rounded to an integer."""
    from rapidfuzz import fuzz

    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(fuzz.ratio(a, b)))


def code_sim_score(prediction: str, ground_truth: str, **_: object) -> float:
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz_ratio(line, ground_truth) / 100


FUNCTIONS: dict[str, Callable[..., float]] = {
    f.__name__: f
    for f in (
        qa_f1_score,
        qa_f1_zh_score,
        rouge_score,
        rouge_zh_score,
        classification_score,
        retrieval_score,
        retrieval_zh_score,
        count_score,
        code_sim_score,
    )
}


# ---------------------------------------------------------------------------- dispatch


def meta_problem(meta: Mapping[str, object] | None) -> str | None:
    """Why an example cannot be scored by the longbench metric (its meta names no official
    metric: not a LongBench example), or None."""
    got = (meta or {}).get("metric")
    if got in FUNCTIONS:
        return None
    return (
        f"needs the example's meta['metric'] (one of {', '.join(FUNCTIONS)}; set by `ragbench "
        f"data import longbench`), got {got!r}"
    )


def longbench_score(
    prediction: str, answers: Sequence[str], meta: Mapping[str, Any] | None
) -> float:
    """The official score of one prediction: ``meta["metric"]`` (set by the importer) over the
    gold answers, maximum; trec/triviaqa/samsum/lsht look at the first line only."""
    problem = meta_problem(meta)
    if problem is not None or meta is None:  # (None: meta names a metric, so it is a mapping)
        raise ValueError(f"the longbench metric {problem}")
    fn = FUNCTIONS[meta["metric"]]
    if subset_name(str(meta.get("dataset", ""))) in FIRST_LINE_SUBSETS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    best = 0.0
    for gold in answers:
        best = max(best, fn(prediction, gold, all_classes=meta.get("all_classes")))
    return float(best)
