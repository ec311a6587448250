"""SQuAD 2.0 scoring, equal to the official v2.0 evaluation script (``evaluate-v2.0.py``).

The official script is not a package, so its rules are written out here (tests/test_squad_v2.py
holds the script's own functions as the oracle):

- exact match and token F1 on SQuAD-normalised text (``normalize.normalize_answer``); F1 of an
  empty answer against anything is 1 if both are empty, else 0;
- a question's gold answers are its texts that normalise to something; a question with none left
  (no answers: SQuAD 2.0's unanswerable questions, or only answers like "the") is scored against
  the empty answer, so a prediction that normalises to empty is right there and wrong elsewhere;
- a question's score is the maximum over its gold answers; the summary splits the questions by
  whether the dataset gave them answers (``HasAns`` / ``NoAns``) and reports percentages.

ragbench's prompts ask a model that finds no answer to reply ``NO_ANSWER`` ("unanswerable"), where
a SQuAD system outputs the empty string: a prediction that normalises to exactly that word is
mapped to "" before scoring. Anything else is an answer, so "Paris, unanswerable" is scored as
the text it is (no credit on a question without an answer), and a literal gold "unanswerable"
is an answer like any other: whether a question has an answer comes from the importer
(``meta["unanswerable"]``), never from its gold text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ragbench.metrics.normalize import NO_ANSWER, normalize_answer

_DECLINE = normalize_answer(NO_ANSWER)


def is_squad_v2(meta: Mapping[str, object] | None) -> bool:
    """The example comes from a SQuAD 2.0 file (``datasets.importers.load_squad`` marks it)."""
    if not meta or meta.get("source") != "squad":
        return False
    return meta.get("squad_v2") is True or meta.get("allow_decline") is True


def as_squad_prediction(prediction: str) -> str:
    """The prediction as the official script reads it: the decline word becomes ""."""
    return "" if normalize_answer(prediction) == _DECLINE else prediction


def gold_answers(answers: Iterable[str], has_answer: bool) -> list[str]:
    """The official gold list: texts that normalise to something, or [""] when none is left."""
    golds = [a for a in answers if normalize_answer(a)] if has_answer else []
    return golds or [""]


def exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_v2_scores(prediction: str, answers: Sequence[str], has_answer: bool) -> dict[str, float]:
    """``{"exact_match", "f1"}`` of one question, as the official script scores it."""
    pred, golds = as_squad_prediction(prediction), gold_answers(answers, has_answer)
    return {
        "exact_match": max(exact(pred, g) for g in golds),
        "f1": max(token_f1(pred, g) for g in golds),
    }


def has_answer(meta: Mapping[str, object]) -> bool:
    """Whether the dataset gave the question answers (the importer's ``meta["unanswerable"]``)."""
    return meta.get("unanswerable") is not True


def squad_v2_summary(
    exact_scores: Sequence[float], f1_scores: Sequence[float], has_answers: Sequence[bool]
) -> dict[str, float]:
    """The official script's summary (percentages): ``exact``, ``f1``, ``total`` over every
    question, and ``HasAns_*`` / ``NoAns_*`` over the questions with / without answers (each
    group only when it has questions, as the script does)."""
    if not len(exact_scores) == len(f1_scores) == len(has_answers):
        raise ValueError(
            f"need one exact, f1 and has_answer per question, got {len(exact_scores)}, "
            f"{len(f1_scores)} and {len(has_answers)}"
        )
    if not exact_scores:
        raise ValueError("no questions to summarise")

    def part(rows: list[int]) -> dict[str, float]:
        return {
            "exact": 100.0 * sum(exact_scores[i] for i in rows) / len(rows),
            "f1": 100.0 * sum(f1_scores[i] for i in rows) / len(rows),
            "total": len(rows),
        }

    out = part(list(range(len(exact_scores))))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        rows = [i for i, h in enumerate(has_answers) if bool(h) is want]
        if rows:
            out |= {f"{prefix}_{k}": v for k, v in part(rows).items()}
    return out
