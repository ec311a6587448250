"""The run's noise pass (``ragbench.experiment.runner`` calls it after generation and the judge
pass): ``noise_sensitivity``, how much accuracy a strategy loses when distractor documents are
added to the corpus it retrieves from.

Which records: those whose answer read a corpus ragbench builds the index of (the strategy
declares ``needs_retrieval``: the built-in ``rag``, ``self_route``) or hands to the pipeline
(a pipeline with a setup hook: its record's ``pipeline_index`` is ``"ragbench corpus"``). Each is
answered a second time, by the same strategy and parameter point, on its example with
``noise_distractors`` (config; default 5) documents put in front of its own: the same question, evidence and gold answers,
a noisier corpus. The others get ``None`` and a ``noise_note`` saying why: closed book and long
context read no retrieved corpus, and a pipeline with its own index never sees the distractors.

The distractors: documents of the run's other examples (multidoc's other passages and other
questions' gold passages, RULER's other haystacks) that are not among the example's documents
and contain none of its gold answers, sorted by id, ``noise_distractors`` of them drawn with a local
RNG seeded by the run's seed and the example id: the same run draws the same ones. In front,
because retrieval is blind to corpus order and a reader that favours early documents meets them
first (the hard case). A dataset whose questions all share one corpus (``corpus``, BEIR) has no
document outside it: its records get ``None`` with a note.

What a user reads: ``noise_sensitivity`` = the record's first answer metric on the clean corpus
minus the same metric on the noisy one (per record; its mean is the accuracy lost to noise, so
lower is better; negative when the noisy answer happened to be better). The noisy answer is kept
in ``noise_prediction`` (the score is derived from it on every pass, so a rescored record stays
consistent), with ``noise_score``, ``noise_metric``, ``noise_distractor_ids`` and
``noise_gold_hit``. Its cost lands in ``noise_*`` meta columns (``NOISE_COST``), never in the
record's ``Cost``: what a strategy costs per query must not depend on how it was evaluated.

Resumable like the judge pass: records are appended again as each chunk finishes (``read_records``
keeps a key's last line); a record that has its score is not redone, and a rerun does no work (the
noisy calls also go through the completion cache). A noisy answer that fails leaves the metric
missing with ``noise_error``, so a resumed run tries again.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from tqdm import tqdm

from ragbench.experiment.config.run import RunConfig
from ragbench.experiment.session import RunSession
from ragbench.io import dumps_canonical
from ragbench.metrics.answer import METRICS, score, string_metrics
from ragbench.secrets import redact_text
from ragbench.strategies import contexts_of, get_strategy, run_batch
from ragbench.strategies.driver import outcome_parts
from ragbench.types import Document, Example, Record

METRIC = "noise_sensitivity"
NOISE_CHUNK = 32  # at most this many answered again (and appended) together: a kill loses one
NOISE_COST = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "llm_calls",
    "latency_seconds",
    "resource_seconds",
    "dollars",
)


def pool(examples: list[Example]) -> list[Document]:
    """Every document of the run's examples, once per id, sorted by id."""
    docs: dict[str, Document] = {}
    for example in examples:
        for doc in example.documents:
            docs.setdefault(doc.id, doc)
    return [docs[k] for k in sorted(docs)]


def distractors(example: Example, docs: list[Document], n: int, seed: int) -> list[Document]:
    """Up to ``n`` documents of ``docs`` that are not the example's own and hold none of its
    gold answers, drawn by a local RNG seeded by ``seed`` and the example id."""
    own = {d.id for d in example.documents} | {d.text for d in example.documents}
    golds = [a.lower() for a in example.answers if a.strip()]
    candidates = [
        d
        for d in docs
        if d.id not in own and d.text not in own and not any(a in d.text.lower() for a in golds)
    ]
    rng = random.Random(f"{seed}/noise/{example.id}")
    return rng.sample(candidates, min(n, len(candidates)))


def noisy(example: Example, added: list[Document]) -> Example:
    """The example with ``added`` in front of its documents: its own corpus id no longer holds
    (the index and a pipeline's setup see a new corpus)."""
    meta = {k: v for k, v in example.meta.items() if k != "corpus_fingerprint"}
    return dataclasses.replace(example, documents=(*added, *example.documents), meta=meta)


def ineligible(record: Record) -> str | None:
    """Why the record's answer cannot meet the distractors (None: it can): it read no corpus
    the run indexes or hands to its system (``strategies.contexts_of``: ``corpus_note``)."""
    return contexts_of(record).corpus_note


def needs_noise(record: Record, count: int) -> bool:
    """A finished, scored answer without its noise score (or measured with another ``count`` of
    distractors)."""
    if record.error is not None or not get_strategy(record.strategy).generates:
        return False
    if not record.scores:  # an unscored question (no gold answer): nothing to compare
        return False
    if METRIC not in record.scores:
        return True
    return "noise_note" not in record.meta and record.meta.get("noise_distractors") != count


def derive(record: Record, example: Example, metric: str | None) -> Record:
    """``noise_sensitivity`` from the stored noisy answer: clean minus noisy on ``metric``. The
    record itself when nothing changes."""
    meta = record.meta
    clean = record.scores.get(metric) if metric is not None else None
    if "noise_prediction" not in meta or metric is None or clean is None:
        return record
    noisy_score = score(meta["noise_prediction"], example.answers, [metric], example.meta)[metric]
    value = float(clean) - noisy_score
    if record.scores.get(METRIC) == value and meta.get("noise_metric") == metric:
        return record
    meta = {**meta, "noise_metric": metric, "noise_score": noisy_score}
    return dataclasses.replace(record, scores={**record.scores, METRIC: value}, meta=meta)


def _with_note(record: Record, note: str) -> Record:
    meta = {k: v for k, v in record.meta.items() if not k.startswith("noise_")}
    return dataclasses.replace(
        record, scores={**record.scores, METRIC: None}, meta={**meta, "noise_note": note}
    )


def _with_noisy(record: Record, added: list[Document], outcome: Any, count: int) -> Record:
    meta = {k: v for k, v in record.meta.items() if not k.startswith("noise_")}
    meta |= {"noise_distractors": count, "noise_distractor_ids": [d.id for d in added]}
    failed, paid = outcome_parts(outcome)
    cost = paid.to_dict() if paid is not None else {}
    meta |= {f"noise_{k}": cost.get(k) for k in NOISE_COST}  # a failure's finished calls too
    if failed is not None:
        scores = {k: v for k, v in record.scores.items() if k != METRIC}
        error = redact_text(f"{type(failed).__name__}: {failed}")
        return dataclasses.replace(record, scores=scores, meta={**meta, "noise_error": error})
    meta |= {"noise_prediction": outcome.prediction, "noise_gold_hit": outcome.meta.get("gold_hit")}
    return dataclasses.replace(record, meta=meta)


def _point(points: dict, record: Record) -> Any:
    return points.get((record.strategy, dumps_canonical(record.params.to_dict())), record.params)


def measures_noise(cfg: RunConfig) -> bool:
    """Whether the config names a noise metric (the runner then calls ``noise_pass``)."""
    return any(METRICS.get(m).kind == "noise" for m in cfg.metrics)


def noise_pass(session: RunSession) -> int:
    """Fill ``noise_sensitivity`` of every finished record of the session that lacks it (module
    docstring), appending each updated record; returns how many records were updated. The
    session's budget (``experiment.budget.Budget``) may stop it between chunks
    (``max_dollars``)."""
    cfg, done, budget = session.cfg, session.done, session.budget
    if not measures_noise(cfg):
        return 0
    by_id = {e.id: e for e in session.examples}
    strings = string_metrics(cfg.metrics)
    metric = strings[0] if strings else None
    docs = pool(session.examples)
    # the config's own points: a stored one has its URL credentials redacted (never on disk)
    points = {(p.strategy, dumps_canonical(p.to_dict())): p for p in cfg.points}
    todo, updates = [], {}
    for key in session.keys:
        record = done.get(key)
        if record is None:
            continue
        example = by_id[record.example_id]
        if not needs_noise(
            record, cfg.noise_distractors
        ):  # done: its score re-derived (a rescored clean answer)
            if (new := derive(record, example, metric)) is not record:
                updates[key] = new
            continue
        note = ineligible(record) or (None if metric else "no string metric to score it with")
        added = distractors(example, docs, cfg.noise_distractors, cfg.seed) if note is None else []
        if note is None and not added:
            note = "no distractors: no document of the run lies outside this example's corpus"
        if note is not None:
            updates[key] = _with_note(record, note)
        else:
            todo.append((key, noisy(example, added), added))
    with session.writer.appending() as writer:
        for key, record in updates.items():
            writer.append(key, record)
        # nothing generated this session: the model that answers is loaded now
        res = session.resources() if todo else None
        bar = tqdm(
            total=len(todo), desc=f"{cfg.name} noise", disable=not session.progress, unit="rec"
        )
        size = min(NOISE_CHUNK, cfg.model.batch_size)  # one LLM call per round, as generation
        answered = 0  # a budget stop leaves the rest of todo for a rerun
        for start in range(0, len(todo), size):
            part = todo[start : start + size]
            again = [done[key] for key, _, _ in part]  # the records answered again
            if not budget.allows(done, again, len(todo) - start, "noise"):
                break
            items = [(ex, _point(points, done[key])) for key, ex, _ in part]
            assert res is not None  # built above: todo is not empty
            outcomes = run_batch(items, res)
            for (key, _, added), outcome in zip(part, outcomes, strict=True):
                record = _with_noisy(done[key], added, outcome, cfg.noise_distractors)
                record = derive(record, by_id[record.example_id], metric)
                writer.append(key, record)
                answered += 1
                bar.update(1)
        bar.close()
    return len(updates) + answered
