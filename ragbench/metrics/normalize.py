"""Answer normalisation shared by every answer metric and by the datasets that record answers.

``normalize_answer`` is SQuAD v1.1's (lowercase, drop punctuation, drop the articles a/an/the,
collapse whitespace), copied because the official script is not a package. ``NO_ANSWER`` is the
gold answer of a question whose context does not hold one (SQuAD 2.0's unanswerable questions);
a prediction declines by saying it (``strategies.prompts.DECLINE`` is the same word).
"""

from __future__ import annotations

import re
import string

NO_ANSWER = "unanswerable"

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 ``normalize_answer``: lower, remove punctuation, articles and extra spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())
