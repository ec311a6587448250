"""Preloaded corpus (cache-augmented generation): the long-context prefix KV computed once, in a
call of its own, before the questions; its cost reported apart from the per-query cost.

``long_context preload: true``: before the first question of a preload group (the same shared
corpus, ``meta["corpus_fingerprint"]``, and overflow policy) the driver sends one *preload*
request: the fitted corpus prefix, the question template with an empty question, one new token. The backend computes the corpus KV and
keeps it (transformers: ``prefix_cache_size``; a server: its prefix cache), so every question
finds the corpus cached and its own cost is its question's prefill over that cache plus its
decode. The preload call's ``Cost`` (the corpus prefill, measured, plus the short tail and one
token) is the one-time cost: each record carries it (``one_time_seconds``, ``one_time_dollars``)
with ``amortised_over`` N, the questions that share it, and its ``amortised_*`` columns add
one_time / N (``Cost.amortise``). N is the questions *answered* (``amortise_answered``, applied
where the results table is assembled, ``experiment.results.table``: the stored table, the
sequential looks and the verdict read it): a run stopped early (``max_dollars``,
``--until-decided``) spreads the preload over the questions it answered, not over those it
planned, and a resumed run that answers the rest ends amortised over all of them.
(``records.jsonl`` keeps what the session planned when it wrote them; the table recomputes.)
The KV lives in the process: a resumed run preloads again (its manifest entry lists that
preload); the table amortises each record's own session's preload over the group's answered
questions, i.e. as if the corpus had been preloaded once, and so does the budget
(``experiment.budget``: each group's one-time cost counted once). The preload request bypasses
the completion cache (``CachedLLM``): a cached answer would compute no KV.

The preload call is charged as if its variant ran alone (``cost.alone``): a corpus another
variant of the run already computed (a plain ``long_context`` on the same corpus, whose prefix
the backend kept) is charged to the preload as computed (``prefix_paid_tokens``/``_seconds``),
so the one-time cost is the same whatever else ran.

Examples without a shared corpus (each its own documents: RULER, multidoc) are not preloaded:
they run as plain long_context, without a one-time cost (the runner logs a warning).

Limits, visible in the records: a backend that keeps no prefix across calls (``prefix_reuse:
false``, ``prefix_cache_size: 0``, a server without prefix caching) recomputes the corpus per
question (``cached_prompt_tokens`` 0), and the amortised columns then count it twice. A run that
also has a plain long-context variant on the same corpus shares one prefix cache: whichever
variant runs second finds the corpus cached, as a server's cache would, and is charged for it
all the same (the alone rule above); its measured ``resource_seconds`` stay what the device did.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TypeGuard

from ragbench.cost.accounting import Cost
from ragbench.llm.cache import CachedLLM
from ragbench.strategies.base import Resources
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.params import LongContextParams, StrategyParams
from ragbench.strategies.prompt_format import FULL, prompt_format
from ragbench.types import Example, Record


def wanted(params: StrategyParams) -> TypeGuard[LongContextParams]:
    """Whether ``params`` ask for a preload (long_context preload: true)."""
    strategy = getattr(params, "strategy", None)  # (None: a work item without parameters)
    return strategy == "long_context" and bool(getattr(params, "preload", False))


def group(example: Example, params: StrategyParams) -> tuple | None:
    """The preload group of an item (None: nothing preloaded for it): its shared corpus and
    overflow. Only a shared corpus (``meta["corpus_fingerprint"]``: the ``corpus`` and BEIR
    datasets) is preloaded; an example with its own documents (RULER, multidoc) runs as plain
    long_context: a preload per example would be sent with its round's others before any
    question and evict them (a one-prefix cache), so its question paid the corpus and a one-time
    cost besides."""
    return group_of(example.meta, params) if wanted(params) else None


def group_of(meta: Mapping[str, object], params: StrategyParams) -> tuple | None:
    """``group`` from the example's ``meta`` (what a results table keeps of it)."""
    if not wanted(params):
        return None
    corpus = meta.get("corpus_fingerprint")
    return (str(corpus), params.overflow) if corpus else None


def unshared(items: Sequence[tuple[Example, StrategyParams]]) -> int:
    """Preload items that get no preload: their example has no shared corpus."""
    return sum(wanted(p) and group(e, p) is None for e, p in items)


def count(items: Sequence[tuple[Example, StrategyParams]]) -> dict[tuple, int]:
    """Questions per preload group: what each group's one-time cost is amortised over."""
    return dict(Counter(g for e, p in items if (g := group(e, p)) is not None))


def ensure(items: Sequence[tuple[Example, StrategyParams]], res: Resources) -> None:
    """Send the preload request of every group of ``items`` not yet preloaded (once per run;
    a group not counted by the runner is amortised over its questions among ``items``)."""

    # past the completion cache: a stored answer to the preload computes no KV, and the first
    # question would pay the corpus (a resumed or extended run)
    llm = res.llm.llm if isinstance(res.llm, CachedLLM) else res.llm
    counted = count(items)
    for example, params in items:
        key = group(example, params)
        if key is None or key in res.preloaded or not wanted(params):  # (no key: not wanted)
            continue
        res.preload_over.setdefault(key, counted[key])
        try:
            _, prefix, _ = long_context_prompt(example, res, params.overflow)
            fmt = prompt_format(example)
            tail = fmt.frame(dataclasses.replace(example, question=""), FULL).tail
            request = res.request(prefix + tail, prefix, rid=f"preload:{key[0][:16]}", fmt=fmt)
            request = dataclasses.replace(request, max_new_tokens=1, stop=())
            completion = llm.generate([request])[0]
            # the group's variants pay the corpus here (their one-time cost), as if each ran
            # alone (cost/alone.py): a corpus another variant left cached is charged as computed,
            # and their questions then reuse it, whoever asks first
            first, *others = sorted({p.label() for e, p in items if group(e, p) == key})
            res.preloaded[key] = res.cost(res.alone.charge(first, request, completion))
            for label in others:
                res.alone.sent(label, request)
        except Exception as exc:  # every question of the group gets this error
            res.preloaded[key] = exc


def amortised(cost: Cost, example: Example, params: StrategyParams, res: Resources) -> Cost:
    """A preload question's own ``cost`` with its group's one-time cost beside it."""
    key = group(example, params)
    if key is None:  # no shared corpus: nothing was preloaded, its own cost is all it cost
        return cost
    one_time = res.preloaded[key]  # ensure() ran before the question (run_batch, the steps)
    if isinstance(one_time, Exception):
        raise one_time
    return cost.amortise(one_time, res.preload_over.get(key, 1))


def sharing(
    records: Sequence[Record], meta: Mapping[str, Mapping[str, object]]
) -> dict[tuple, list]:
    """Per preload group, the indices of ``records`` that share its one-time cost: the answered
    questions (a record whose cost carries ``one_time_seconds``; a failed one has no cost).
    ``meta``: example id -> the example's meta (its ``corpus_fingerprint``); a record whose
    group it cannot tell is grouped with its variant's."""
    out: dict[tuple, list] = {}
    for i, record in enumerate(records):
        cost = getattr(record, "cost", None)
        if getattr(cost, "one_time_seconds", None) is None or getattr(record, "error", None):
            continue
        params = record.params
        key = group_of(meta.get(record.example_id) or {}, params) or ("variant", params.label())
        out.setdefault(key, []).append(i)
    return out


def amortise_answered(records: Sequence[Record], meta: Mapping[str, Mapping[str, object]]) -> list:
    """``records`` with each one-time cost amortised over the questions that answered with it
    (``sharing``), whatever the run planned: ``amortised_over`` N and ``amortised_*`` = own +
    one_time / N (``Cost.shared_by``). Records without a one-time cost are returned as they
    are."""
    out = list(records)
    for indices in sharing(out, meta).values():
        for i in indices:
            out[i] = dataclasses.replace(out[i], cost=out[i].cost.shared_by(len(indices)))
    return out


def one_time_dollars(
    records: Sequence[Record], meta: Mapping[str, Mapping[str, object]]
) -> dict[tuple, float]:
    """Per preload group of ``records``, its one-time dollars, once: its records' mean one-time
    dollars (what their amortised shares add up to; the same on each unless a resumed session
    preloaded again). Unknown dollars (an api sheet's reprice) count nothing."""
    out = {}
    for key, indices in sharing(records, meta).items():
        known = [d for i in indices if (d := records[i].cost.one_time_dollars) is not None]
        out[key] = sum(known) / len(known) if known else 0.0
    return out


def summary(res: Resources | None) -> list[dict[str, object]]:
    """The run's preloads for its manifest: group, one-time seconds and dollars, questions."""
    out: list[dict[str, object]] = []
    if res is None:
        return out
    for key, one in res.preloaded.items():
        done = not isinstance(one, Exception)
        out.append(
            {
                "corpus": key[0],
                "overflow": key[1],
                "amortised_over": res.preload_over[key],
                # charged, as the records carry it (Cost.amortise)
                "one_time_seconds": one.resource_seconds + one.prefix_paid_seconds
                if done
                else None,
                "one_time_dollars": one.dollars if done else None,
                "prompt_tokens": one.prompt_tokens if done else None,
                "error": None if done else f"{type(one).__name__}: {one}",
            }
        )
    return out
