"""LongBench v2's answer extraction and accuracy, as its official scripts compute them.

LongBench v2 (THUDM/LongBench, ``pred.py`` and ``result.py``) asks four-choice questions and
scores a reply by accuracy: ``extract_answer`` (copied from ``pred.py``, regexes and order
unchanged) takes the letter from "The correct answer is (B)" (else "The correct answer is B",
after removing every ``*`` so Markdown bold does not hide it); no match is ``None``, which is
wrong. ``judge`` is ``pred == answer``. ``result.py`` reports 100 x the mean accuracy overall,
by ``difficulty`` (easy / hard) and by ``length`` bucket (short / medium / long), rounded to one
decimal; with its ``compensated`` switch a reply with no extractable letter counts 0.25 (the
chance rate). ``ragbench.analysis.longbench_v2`` builds that table from a results table.

The registered metric ``longbench_v2_accuracy`` (``metrics.answer``) is ``judge`` for one reply:
the gold answer is the letter (the importer, ``datasets.longbench_v2``, stores it as the only
gold answer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

CHOICES = ("A", "B", "C", "D")  # the gold ``answer`` is one of these letters
DIFFICULTIES = ("easy", "hard")  # ``difficulty`` values (result.py's Easy / Hard columns)
LENGTHS = ("short", "medium", "long")  # ``length`` buckets (result.py's Short / Medium / Long)
METRIC = "longbench_v2_accuracy"  # its name in metrics.answer.METRICS (the importer names it)
COMPENSATED = 0.25  # result.py's credit for a reply with no extractable answer, when compensated


def extract_answer(response: str) -> str | None:
    """The chosen letter of a reply, or None: ``pred.py``'s ``extract_answer``, line for line."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    if match:
        return match.group(1)
    return None


def longbench_v2_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the extracted letter is the gold letter (``answers[0]``), else 0.0 (no letter
    extracted included): ``pred.py``'s ``judge``."""
    if not answers:
        return 0.0
    return float(extract_answer(prediction) == answers[0])
