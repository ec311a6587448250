"""Shard planning for a run spread over workers (``executor="ray"``): which rounds run together,
on one worker, in order. Pure functions of the pending work; the Ray executor schedules what
they return.

The unit of work is the runner's round (``runner.plan_rounds``: at most ``batch_size`` items sent
to the model in one call), planned exactly as a local run plans it, so every record of a sharded
run is computed in the same batch as in a local run and is the same record. Rounds are then
joined into *shards*: two rounds that hold questions on the same document (an example's own
documents, by content) or the same shared corpus (``meta["corpus_fingerprint"]``) belong to one
shard, so a backend's prefix cache (the corpus KV, a server's prefix cache, a preload) serves all
of them on one worker, as it would in a local run. A shard runs on one worker, its rounds in plan
order; each worker takes a contiguous block of shards in plan order (``assign``), so neighbouring
rounds, which often share more than a document (NIAH haystacks share the essay text before their
needles, which the transformers backend's prefix cache reuses across calls), stay together too:
only the first round of each block starts with a cold prefix cache.

What limits parallelism, said by ``balance``: a run whose questions all share one corpus is one
shard (one worker). A round holds one strategy variant, so an example's variants are in as many
rounds, joined: the k-th rounds of all variants, which hold the same examples, are one shard,
and a smaller ``model.batch_size`` gives more, smaller shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ragbench.types import Example


def group_key(example: Example) -> str:
    """What an example's prompt prefix is built from: its shared corpus (the fingerprint its
    dataset stored) or, for an example with its own documents, a hash of those documents (ids
    and texts), so two questions on the same document share a key."""
    shared = example.meta.get("corpus_fingerprint")
    if shared:
        return f"corpus:{shared}"
    h = hashlib.sha1(usedforsecurity=False)
    for doc in example.documents:
        h.update(doc.id.encode("utf-8") + b"\0" + doc.text.encode("utf-8") + b"\1")
    return f"docs:{h.hexdigest()}"


def plan_shards(rounds: Sequence[Sequence[Any]]) -> list[list[int]]:
    """The shards of ``rounds`` (lists of items whose first element is an ``Example``, as the
    runner plans them): lists of round indices, each in plan order; rounds sharing a
    ``group_key`` are in one shard. Ordered by first round. Deterministic."""
    parent = list(range(len(rounds)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    memo: dict[int, str] = {}  # one hash per example object (an example has several points)
    for r, items in enumerate(rounds):
        for item in items:
            example = item[0]
            k = memo.get(id(example))
            if k is None:
                k = memo[id(example)] = group_key(example)
            first = owner.setdefault(k, r)
            a, b = find(first), find(r)
            if a != b:
                parent[max(a, b)] = min(a, b)
    shards: dict[int, list[int]] = {}
    for r in range(len(rounds)):
        shards.setdefault(find(r), []).append(r)
    return [shards[root] for root in sorted(shards)]


def assign(sizes: Sequence[int], workers: int) -> list[int]:
    """The worker of each shard (``sizes``: items per shard, in plan order): contiguous blocks
    of about ``total / workers`` items each, a shard going to the block its middle falls in."""
    total, seen, out = sum(sizes), 0, []
    for size in sizes:
        middle = seen + size / 2
        out.append(min(workers - 1, int(middle * workers / total)) if total else 0)
        seen += size
    return out


def balance(
    shards: Sequence[Sequence[int]], rounds: Sequence[Sequence[object]], workers: int
) -> str:
    """A one-line note when the shards cannot keep ``workers`` busy (fewer shards than workers,
    or one shard half again over an even share of the work), else ''."""
    total = sum(len(r) for r in rounds)
    if not total or workers <= 1:
        return ""
    largest = max(sum(len(rounds[r]) for r in members) for members in shards)
    if len(shards) < workers or largest > 1.5 * total / workers:
        return (
            f"{len(shards)} shard(s) for {workers} workers, the largest with {largest} of "
            f"{total} items: questions sharing a document or corpus stay on one worker (a shared "
            "corpus is one shard; the rounds of every variant on the same questions are one "
            "shard: a smaller model.batch_size gives more, smaller shards)"
        )
    return ""
