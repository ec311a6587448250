"""Preloaded corpus (cache-augmented generation): the long-context prefix KV computed once, in a
call of its own, before the questions; its cost reported apart from the per-query cost.

``long_context preload: true``: before the first question of a preload group (the same shared
corpus, ``meta["corpus_fingerprint"]``, and overflow policy) the driver sends one *preload*
request: the fitted corpus prefix, the question template with an empty question, one new token. The backend computes the corpus KV and
keeps it (transformers: ``prefix_cache_size``; a server: its prefix cache), so every question
finds the corpus cached and its own cost is its question's prefill over that cache plus its
decode. The preload call's ``Cost`` (the corpus prefill, measured, plus the short tail and one
token) is the one-time cost: each record carries it (``one_time_seconds``, ``one_time_dollars``)
with ``amortised_over`` N, the questions of the run that share it, and its ``amortised_*``
columns add one_time / N (``Cost.amortise``). The KV lives in the process: a resumed run
preloads again and amortises that over the questions it still answers. The preload request
bypasses the completion cache (``CachedLLM``): a cached answer would compute no KV.

Examples without a shared corpus (each its own documents: RULER, multidoc) are not preloaded:
they run as plain long_context, without a one-time cost (the runner logs a warning).

Limits, visible in the records: a backend that keeps no prefix across calls (``prefix_reuse:
false``, ``prefix_cache_size: 0``, a server without prefix caching) recomputes the corpus per
question (``cached_prompt_tokens`` 0), and the amortised columns then count it twice. A run that
also has a plain long-context variant on the same corpus shares one prefix cache: whichever
variant runs second finds the corpus cached, as a server's cache would. Measure a preload's
one-time cost in a run of its own.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ragbench.cost.accounting import Cost
from ragbench.llm.cache import CachedLLM
from ragbench.strategies.base import Resources
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.prompt_format import FULL, prompt_format
from ragbench.types import Example


def wanted(params: StrategyParams) -> bool:
    """Whether ``params`` ask for a preload (long_context preload: true)."""
    return params.strategy == "long_context" and bool(getattr(params, "preload", False))


def group(example: Example, params: StrategyParams) -> tuple | None:
    """The preload group of an item (None: nothing preloaded for it): its shared corpus and
    overflow. Only a shared corpus (``meta["corpus_fingerprint"]``: the ``corpus`` and BEIR
    datasets) is preloaded; an example with its own documents (RULER, multidoc) runs as plain
    long_context: a preload per example would be sent with its round's others before any
    question and evict them (a one-prefix cache), so its question paid the corpus and a one-time
    cost besides."""
    if not wanted(params):
        return None
    corpus = example.meta.get("corpus_fingerprint")
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
        if key is None or key in res.preloaded:
            continue
        res.preload_over.setdefault(key, counted[key])
        try:
            _, prefix, _ = long_context_prompt(example, res, params.overflow)
            fmt = prompt_format(example)
            tail = fmt.frame(dataclasses.replace(example, question=""), FULL).tail
            request = res.request(prefix + tail, prefix, rid=f"preload:{key[0][:16]}", fmt=fmt)
            request = dataclasses.replace(request, max_new_tokens=1, stop=())
            completion = llm.generate([request])[0]
            res.preloaded[key] = res.cost(completion)
            # the group's variants paid the corpus here (their one-time cost): under the alone
            # rule (cost/alone.py) their questions reuse it, whoever asks first
            for label in {p.label() for e, p in items if group(e, p) == key}:
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


def summary(res: Resources | None) -> list[dict[str, Any]]:
    """The run's preloads for its manifest: group, one-time seconds and dollars, questions."""
    out = []
    for key, one in (res.preloaded if res is not None else {}).items():
        done = not isinstance(one, Exception)
        out.append({"corpus": key[0], "overflow": key[1], "amortised_over": res.preload_over[key],
                    "one_time_seconds": one.resource_seconds if done else None,
                    "one_time_dollars": one.dollars if done else None,
                    "prompt_tokens": one.prompt_tokens if done else None,
                    "error": None if done else f"{type(one).__name__}: {one}"})  # fmt: skip
    return out
