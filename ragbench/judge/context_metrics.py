"""RAGAS-style context metrics, judged by the judge model: how good were the contexts a record
read (``contexts.record_contexts``: a pipeline's, or the built-in RAG's chunks), and does its
answer address the question. Definitions follow RAGAS (explodinggradients/ragas,
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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ragbench.datasets.haystack import sentences
from ragbench.judge.calls import Job, Judge, keep_repeats, settled
from ragbench.judge.prompts import parse_question
from ragbench.metrics.normalize import normalize_answer
from ragbench.secrets import redact_text
from ragbench.strategies import get_strategy
from ragbench.types import Example, Record

CONTEXT_METRICS = ("context_precision", "context_recall", "answer_relevancy")
QUESTION_TOKENS = 64  # new tokens allowed for a verdict line and a generated question, at least
CONTEXT_SEPARATOR = "\n\n"  # between the contexts of one recall prompt
# (example, record) -> the record's context texts, best first (None: none); raises to leave the
# context metrics unscored, with the reason (``contexts.record_contexts``)
ContextsFn = Callable[[Example, Record], "list[str] | None"]

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


# ---------------------------------------------------------------------------- the judge pass


def context_jobs(items, todo, scores, meta, judge: Judge, contexts_fn: ContextsFn | None):
    """The judge calls of the context metrics in ``todo``; records that cannot be judged get
    None and a ``<metric>_note`` (in ``scores`` / ``meta``) instead."""
    if judge.embedder is None and any("answer_relevancy" in t for t in todo):
        raise ValueError("answer_relevancy needs an embedder (Judge.embedder)")
    jobs: list[Job] = []
    for i, (example, record) in enumerate(items):
        wanted = [m for m in todo[i] if m in CONTEXT_METRICS]
        contexts, why = None, None
        if any(m != "answer_relevancy" for m in wanted):
            contexts, why = _contexts(example, record, contexts_fn)
        for metric in wanted:
            prompt = judge.prompts[metric]
            meta[i][f"{metric}_prompt"] = prompt.name
            if metric == "answer_relevancy":
                units, reason = _relevancy_units(record, judge)
                if units == [] and reason is None:  # an empty answer: relevant to nothing
                    scores[i][metric] = 0.0
                    meta[i][f"{metric}_note"] = "empty answer: no question to generate"
                    continue
            else:
                units, reason = _context_units(metric, example, record, contexts, why)
                if metric == "context_recall" and reason is None:
                    meta[i]["context_recall_statements"] = [u["statement"] for u in units]
            extra = _job_extras(metric, prompt, judge)
            for fields in units if reason is None else []:  # over the window: unscored
                reason = judge.too_long(Job(i, metric, 0, fields, **extra).request(judge, 1))
                if reason is not None:
                    break
            if reason is not None:
                scores[i][metric] = None
                meta[i][f"{metric}_note"] = reason
                continue
            n = len(units)
            for s in range(judge.samples):
                for u, fields in enumerate(units):
                    tag = s * n + u if metric == "answer_relevancy" else s
                    jobs.append(Job(i, metric, s, fields, unit=u, tag=tag, **extra))
    return jobs


def _contexts(example, record, contexts_fn) -> tuple[list[str] | None, str | None]:
    """(contexts, None), or (None, why they cannot be judged)."""
    try:
        contexts = contexts_fn(example, record) if contexts_fn else None
    except Exception as exc:  # contexts that cannot be rebuilt: unscored, said why
        return None, redact_text(f"contexts unavailable: {exc}")
    if not contexts:
        return None, f"{record.strategy} records no retrieved contexts"
    return contexts, None


def _context_units(metric, example, record, contexts, why) -> tuple[list[dict], str | None]:
    answers = [a for a in example.answers if a.strip()]
    if not answers:
        return [], "no gold answers"
    if why is not None:
        return [], why
    base = {"question": example.question, "answers": " | ".join(answers)}
    if metric == "context_precision":
        return [{**base, "context": c} for c in contexts], None
    joined = CONTEXT_SEPARATOR.join(contexts)
    return [{**base, "context": joined, "statement": s} for s in statements(answers)], None


def _relevancy_units(record, judge: Judge) -> tuple[list[dict], str | None]:
    if not get_strategy(record.strategy).generates:
        return [], f"{record.strategy} writes no answer"
    if not record.prediction.strip():
        return [], None
    return [{"prediction": record.prediction}] * judge.questions, None


def _job_extras(metric: str, prompt, judge: Judge) -> dict[str, Any]:
    if metric != "answer_relevancy":
        return {}
    labels = dict(prompt.labels)
    return {
        "parse": lambda reply: parse_question(reply, labels),
        "max_new_tokens": max(judge.max_new_tokens, QUESTION_TOKENS),
    }


def collect_context_jobs(jobs: Sequence[Job], items, scores, meta, judge: Judge) -> None:
    """Scores and per-record detail from the finished ``jobs`` (see the module docstring)."""
    relevancy_grids: dict[int, list[list[Job]]] = {}
    for i, metric, group in settled(jobs, items, meta, judge):
        n_units = 1 + max(j.unit for j in group)
        grid: list[list[Any]] = [[None] * n_units for _ in range(judge.samples)]
        for j in group:
            grid[j.sample][j.unit] = j
        meta[i][f"{metric}_replies"] = [[j.reply for j in row] for row in grid]
        if metric == "answer_relevancy":
            relevancy_grids[i] = grid
            continue
        verdicts = [[j.verdict for j in row] for row in grid]
        meta[i][f"{metric}_verdicts"] = verdicts
        formula = average_precision if metric == "context_precision" else attributed_share
        _score(i, metric, [None if None in v else formula(v) for v in verdicts], scores, meta)
    if relevancy_grids:
        _answer_relevancy(relevancy_grids, items, scores, meta, judge)


def _score(i: int, metric: str, per_sample: list, scores, meta) -> None:
    keep_repeats(metric, per_sample, scores[i], meta[i])


def _answer_relevancy(grids: dict[int, list[list[Job]]], items, scores, meta, judge) -> None:
    """Cosines of each record's question and its generated questions, all embedded at once."""
    texts: list[str] = []
    where: dict[tuple[int, int], int] = {}  # (record, sample) -> its question's row in texts
    for i, grid in grids.items():
        meta[i]["answer_relevancy_verdicts"] = [[_part(j, 0) for j in row] for row in grid]
        meta[i]["answer_relevancy_questions"] = [[_part(j, 1) for j in row] for row in grid]
        for s, row in enumerate(grid):
            if all(j.verdict is not None for j in row):
                where[(i, s)] = len(texts)
                texts += [items[i][0].question, *(j.verdict[1] for j in row)]
    vectors = judge.embedder.embed_queries(texts) if texts else None  # L2-normalised
    for i, grid in grids.items():
        per_sample, sims_out = [], []
        for s, row in enumerate(grid):
            if (i, s) not in where:
                per_sample.append(None)
                sims_out.append(None)
                continue
            start = where[(i, s)]
            sims = vectors[start + 1 : start + 1 + len(row)] @ vectors[start]
            sims_out.append([float(x) for x in sims])
            per_sample.append(relevancy(sims, [j.verdict[0] for j in row]))
        meta[i]["answer_relevancy_similarities"] = sims_out
        _score(i, "answer_relevancy", per_sample, scores, meta)


def _part(job: Job, k: int) -> Any:
    return None if job.verdict is None else job.verdict[k]
