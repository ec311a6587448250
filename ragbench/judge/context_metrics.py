"""RAGAS-style context metrics, judged by the judge model, one class each (``metric.JudgeMetric``):
how good were the contexts a record read (``strategies.contexts_of(...).texts()``: a pipeline's,
or the built-in RAG's chunks), and does its answer address the question. Definitions follow RAGAS (explodinggradients/ragas,
``src/ragas/metrics/``), with the differences listed below.

- ``context_precision`` (``_context_precision.py``, ``LLMContextPrecisionWithReference``): one
  judge call per retrieved context, in rank order, "was this context useful in arriving at the
  reference answer?" -> v_k in {0, 1}; score = sum_k (precision@k * v_k) / (useful contexts in the
  top K), precision@k = (v_1 + ... + v_k) / k: average precision, 1 when every useful context
  ranks above every useless one. 0 when none is useful (RAGAS divides by ``sum(v) + 1e-10``:
  the same numbers, 0 included).
- ``context_recall`` (``_context_recall.py``, ``LLMContextRecall``): the reference answer split
  into statements (``statements``: its sentences; a short answer is one statement; each distinct
  gold answer counts, so every value of a multi-value answer must be found), one call per
  statement "can it be attributed to the contexts?" (all of them, rank order, blank-line
  separated) -> recall = attributed / statements. RAGAS has the judge split the reference and
  classify every sentence in one JSON reply; here the split is deterministic and each verdict
  is one short reply, parsed strictly like the other judge metrics.
- ``answer_relevancy`` (``_answer_relevance.py``, ``ResponseRelevancy``): the judge writes
  ``Judge.questions`` (N, default 3: RAGAS's ``strictness``) questions that the answer replies
  to, each with a committal / noncommittal verdict; score = mean cosine between the original
  question and the generated ones, times 0 if any generation calls the answer noncommittal (as
  RAGAS's ``np.any``). The cosine uses the run's judge embedder (``Judge.embedder``, as
  ``semantic_similarity``), ``embed_queries`` for both sides (both are questions; RAGAS embeds
  the original as a query and the generated ones as documents), and the mean is clipped at 0 to
  keep scores in [0, 1]. An empty answer scores 0 without a call.

The N questions follow the ``samples`` convention (``calls``): each is its own request, tagged
in its system message (question q of sample s carries tag s * N + q; the very first none), so
each has its own cache key and, at ``temperature > 0``, its own sampling RNG: the questions
differ. At temperature 0 the N requests are still distinct prompts, but a greedy judge often
writes the same question N times; the score is then that one question's cosine, for N times the
calls (set ``judge.questions: 1`` to save them, or a temperature > 0 to make N mean something).

Each sample (``Judge.samples``) judges every context / statement / question afresh; a sample's
score needs every one of its verdicts, and the metric is the mean of the samples that have a
score. A reply still unreadable after ``max_attempts`` leaves its verdict ``None`` (never 0):
with no complete sample the metric is None with a ``<metric>_note``. A judge call that fails
leaves the metric missing, so a rerun retries it. Records without contexts (closed book, long
context) or without gold answers (precision, recall), or without an answer (relevancy, for a
strategy that writes none), are None with a ``<metric>_note`` saying why.

Per-record detail in meta: ``<metric>_verdicts`` (per sample, per context / statement /
question: 1, 0 or None; for relevancy 1 = committal), ``<metric>_samples`` (each sample's
score), with more than one sample ``<metric>_spread`` (their standard deviation,
``calls.keep_repeats``), ``<metric>_replies``, ``<metric>_prompt``; ``context_recall_statements``;
``answer_relevancy_questions`` and ``answer_relevancy_similarities`` (per sample, per question).
``agreement.judge_agreement`` reads ``<metric>_verdicts`` for Fleiss' kappa across samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragbench.datasets.haystack import sentences
from ragbench.judge.calls import Job, Judge, keep_repeats
from ragbench.judge.metric import ANSWER, CONTEXTS, REFERENCES, Judged, JudgeMetric, Sample, Unasked
from ragbench.judge.prompts import JudgePrompt, parse_question
from ragbench.metrics.normalize import normalize_answer

QUESTION_TOKENS = 64  # new tokens allowed for a verdict line and a generated question, at least
CONTEXT_SEPARATOR = "\n\n"  # between the contexts of one recall prompt

# ---------------------------------------------------------------------------- the formulas (pure)


def average_precision(verdicts: Sequence[int]) -> float:
    """RAGAS's context precision of per-context verdicts in rank order (see the docstring)."""
    useful, total = 0, 0.0
    for k, v in enumerate(verdicts, start=1):
        if v:
            useful += 1
            total += useful / k  # precision@k, counted where the k-th context is useful
    return total / useful if useful else 0.0


def attributed_share(verdicts: Sequence[int]) -> float:
    """Context recall: the share of the reference's statements the contexts support."""
    return sum(verdicts) / len(verdicts)


def relevancy(similarities: Sequence[float], committal: Sequence[int]) -> float:
    """Answer relevancy: mean cosine, 0 if any generation found the answer noncommittal."""
    if not all(committal):
        return 0.0
    return float(max(0.0, min(1.0, float(np.mean(similarities)))))


def statements(answers: Sequence[str]) -> list[str]:
    """The statements of the reference: each gold answer's sentences (a short answer is one),
    the same statement (after SQuAD normalisation) once."""
    out, seen = [], set()
    for answer in (a.strip() for a in answers):
        for sentence in sentences(answer) if answer else []:
            key = normalize_answer(sentence) or sentence
            if key not in seen:
                seen.add(key)
                out.append(sentence)
    return out


# ---------------------------------------------------------------------------- the metrics


class _AgainstTheReference(JudgeMetric):
    """RAGAS's context metrics: the retrieved contexts judged against the reference (the
    question and its gold answers), one call per unit (``units``)."""

    needs = (REFERENCES, CONTEXTS)
    by_unit = True

    def asks(self, sample: Sample, judge: Judge) -> list[dict[str, str]]:
        return [{**sample.asked_about(), **unit} for unit in self.units(sample)]

    def units(self, sample: Sample) -> list[dict[str, str]]:
        """What each call asks besides the reference."""
        raise NotImplementedError


class ContextPrecision(_AgainstTheReference):
    """One call per retrieved context, in rank order: useful for the reference? -> AP."""

    name = "context_precision"
    prompt = "context-precision-v1"

    def units(self, sample: Sample) -> list[dict[str, str]]:
        return [{"context": c} for c in sample.contexts()]

    def score_samples(self, verdicts: list) -> float:
        return average_precision(verdicts)


class ContextRecall(_AgainstTheReference):
    """One call per statement of the reference: attributable to the contexts? -> their share."""

    name = "context_recall"
    prompt = "context-recall-v1"

    def units(self, sample: Sample) -> list[dict[str, str]]:
        joined = CONTEXT_SEPARATOR.join(sample.contexts())
        return [{"context": joined, "statement": s} for s in statements(sample.references)]

    def detail(self, units: Sequence[dict[str, str]]) -> dict[str, object]:
        return {"context_recall_statements": [u["statement"] for u in units]}

    def score_samples(self, verdicts: list) -> float:
        return attributed_share(verdicts)


class AnswerRelevancy(JudgeMetric):
    """The answer addresses the question: questions written from it -> mean cosine to the real one.

    ``Judge.questions`` generated questions per sample, each with a committal verdict; the mean
    cosine to the real question (the judge embedder), 0 if any is noncommittal."""

    name = "answer_relevancy"
    needs = (ANSWER,)
    prompt = "answer-relevancy-v1"
    by_unit = True
    needs_embedder = True

    def asks(self, sample: Sample, judge: Judge) -> list[dict[str, str]]:
        if not sample.answer.strip():  # relevant to nothing
            raise Unasked(0.0, "empty answer: no question to generate")
        return [{"prediction": sample.answer}] * judge.questions

    def tag(self, sample: int, unit: int, units: int) -> int:
        return sample * units + unit  # N prompts alike but for their tag: each its own request

    def max_new_tokens(self, judge: Judge) -> int | None:
        return max(judge.max_new_tokens, QUESTION_TOKENS)

    def parse(self, reply: str, prompt: JudgePrompt) -> object:
        return parse_question(reply, dict(prompt.labels))  # (verdict, question) or None

    def collect(self, judged: list[Judged], judge: Judge) -> None:
        """Cosines of each record's question and its generated questions, all embedded at once."""
        texts: list[str] = []
        where: dict[tuple[int, int], int] = {}  # (record, sample) -> its question's row in texts
        for r, done in enumerate(judged):
            grid = done.grid
            done.meta[f"{self.name}_replies"] = [[j.reply for j in row] for row in grid]
            done.meta["answer_relevancy_verdicts"] = [[_part(j, 0) for j in row] for row in grid]
            done.meta["answer_relevancy_questions"] = [[_part(j, 1) for j in row] for row in grid]
            for s, row in enumerate(grid):
                if all(j.verdict is not None for j in row):
                    where[(r, s)] = len(texts)
                    texts += [done.sample.question, *(j.verdict[1] for j in row)]
        vectors = judge.embedder.embed_queries(texts) if texts else None  # L2-normalised
        for r, done in enumerate(judged):
            per_sample: list[float | None] = []
            sims_out: list[list[float] | None] = []
            for s, row in enumerate(done.grid):
                if (r, s) not in where:
                    per_sample.append(None)
                    sims_out.append(None)
                    continue
                start = where[(r, s)]
                assert vectors is not None  # where is not empty: texts were embedded
                sims = vectors[start + 1 : start + 1 + len(row)] @ vectors[start]
                sims_out.append([float(x) for x in sims])
                per_sample.append(relevancy(sims, [j.verdict[0] for j in row]))
            done.meta["answer_relevancy_similarities"] = sims_out
            keep_repeats(self.name, per_sample, done.scores, done.meta)


def _part(job: Job, k: int) -> object:
    return None if job.verdict is None else job.verdict[k]
