"""The judge metrics of an answer: ``judge_correct`` (does it mean the same as a gold answer),
``judge_faithful`` (is it supported by the context the strategy gave the model) and
``semantic_similarity`` (embeddings, no judge LLM). One class each (``metric.JudgeMetric``);
the judge pass (``judging``) runs them.

- ``judge_correct`` / ``judge_faithful``: one call per judge sample, one binary verdict; the
  score is the mean of the readable samples (``calls.keep_repeats``).
- ``semantic_similarity``: cosine of the prediction's and each gold answer's embedding (the
  same ``embed_documents`` for both: a symmetric comparison), max over the answers, clipped at
  0; an empty prediction scores 0 (it resembles no answer).
"""

from __future__ import annotations

import numpy as np

from ragbench.judge.calls import Judge
from ragbench.judge.metric import (
    ANSWER,
    CONTEXT,
    REFERENCES,
    Judged,
    JudgeMetric,
    Sample,
    Unasked,
)


class JudgeCorrect(JudgeMetric):
    """The answer means the same as a gold answer (0/1 per sample)."""

    name = "judge_correct"
    needs = (ANSWER, REFERENCES)
    prompt = "correct-v1"
    against_strings = True

    def asks(self, sample: Sample, judge: Judge) -> list[dict[str, str]]:
        return [{**sample.asked_about(), "prediction": sample.answer}]


class JudgeFaithful(JudgeMetric):
    """The answer is supported by the context the model read (0/1 per sample)."""

    name = "judge_faithful"
    needs = (ANSWER, CONTEXT)
    prompt = "faithful-v1"

    def asks(self, sample: Sample, judge: Judge) -> list[dict[str, str]]:
        fields = {"question": sample.question, "prediction": sample.answer}
        return [{**fields, "context": sample.context()}]


class SemanticSimilarity(JudgeMetric):
    """Cosine of the prediction and the gold answers (see the module docstring)."""

    name = "semantic_similarity"
    needs = (REFERENCES,)

    def asks(self, sample: Sample, judge: Judge) -> list[dict[str, str]]:
        if not sample.answer.strip():
            raise Unasked(0.0)  # an empty answer resembles no answer
        return []  # no judge call: ``collect`` embeds

    def collect(self, judged: list[Judged], judge: Judge) -> None:
        if not judged:
            return
        if judge.embedder is None:
            raise ValueError("semantic_similarity needs an embedder (Judge.embedder)")
        texts: list[str] = []
        for done in judged:
            texts += [done.sample.answer, *done.sample.references]
        vectors = judge.embedder.embed_documents(texts)  # L2-normalised: dot = cosine
        start = 0
        for done in judged:
            n = len(done.sample.references)
            sims = vectors[start + 1 : start + 1 + n] @ vectors[start]
            done.scores[self.name] = float(np.clip(sims.max(), 0.0, 1.0))
            start += 1 + n
