"""Scheduling a call's requests on the transformers backend (pure functions, no torch): which
requests share a prefix KV cache (``plan_groups``) and how a group is cut into padded batches by
length (``plan_batches``)."""

from __future__ import annotations


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_groups(
    ids: list[list[int]],
    declared: list[int],
    min_shared: int,
    variants: list[str] | None = None,
) -> list[tuple[int, list[int]]]:
    """Group requests that can share a prefix KV cache: ``[(prefix_len, [request indices])]``.

    ``declared[i]`` is the token length of request i's declared prefix (0 = none). Requests with a
    declared prefix group by its tokens, whatever their variant (a document is worth its reuse;
    the alone rule prices a document another variant computed). The others ("loose") group only
    with loose requests of the same ``variants[i]`` (the strategy variant that sent them; None:
    all of one), by ``loose_groups``: each with the requests it shares its deepest common prefix
    with, when that is at least ``min_shared`` tokens. So what a loose request reuses depends on
    its own variant's prompts in the call, never on the other variants of the call (the runner
    sends one variant per call anyway, ``runner.plan_rounds``; other callers mix them). A prefix
    always leaves one prompt token per request, whose forward pass yields the first generated
    token. Requests that share nothing form one group with prefix length 0 (plain batched
    prefill).
    """
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    by_variant: dict[str, list[int]] = {}
    for i, n in enumerate(declared):
        n = min(n, len(ids[i]) - 1)
        if n > 0:
            by_prefix.setdefault(tuple(ids[i][:n]), []).append(i)
        else:
            by_variant.setdefault(variants[i] if variants else "", []).append(i)
    groups = [(len(key), members) for key, members in by_prefix.items()]
    alone: list[int] = []
    for members in by_variant.values():
        found, rest = loose_groups(sorted(members, key=lambda j: ids[j]), ids, min_shared)
        groups += found
        alone += rest
    if alone:
        groups.append((0, sorted(alone)))
    return sorted(groups, key=lambda g: g[1][0])


def loose_groups(
    order: list[int], ids: list[list[int]], min_shared: int
) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """Radix-style groups of requests listed in token order: ``(groups, requests left alone)``.

    In token order two requests share the smallest common prefix of the neighbours between them,
    so a run of neighbours is cut where its shallowest shared prefix is, until each piece shares
    one depth throughout: every request is grouped with the requests it shares its deepest prefix
    with. Requests cut off alone at a depth of ``min_shared`` tokens or more group at that depth
    (they still share it). Why not one group per chain of neighbours under its shortest shared
    prefix (the rule before): a request's reuse then fell with whoever joined the chain (a
    question's prompt reused 134 tokens beside another question's, 81 once a third prompt joined
    the chain), so a record's cost depended on its call mates.
    """
    lcp = [common_prefix_len(ids[a], ids[b]) for a, b in zip(order, order[1:], strict=False)]
    groups: list[tuple[int, list[int]]] = []
    alone: list[int] = []
    pending = [(0, len(order))]  # half-open runs of ``order`` still to cut
    while pending:
        lo, hi = pending.pop()
        if hi - lo < 2:
            alone += order[lo:hi]
            continue
        depth = min(lcp[lo : hi - 1])
        cuts = [k + 1 for k in range(lo, hi - 1) if lcp[k] == depth]
        pieces = list(zip([lo, *cuts], [*cuts, hi], strict=True))
        pending += [(a, b) for a, b in pieces if b - a > 1]  # each shares more within
        single = [order[a] for a, b in pieces if b - a == 1]  # all of them: one depth throughout
        cap = min((len(ids[j]) for j in single), default=0) - 1  # a prompt token of its own each
        if len(single) > 1 and depth >= min_shared and cap > 0:
            groups.append((min(depth, cap), sorted(single)))
        else:
            alone += single
    return groups, alone


def plan_batches(lengths: list[int], batch_size: int, max_padding: float) -> list[list[int]]:
    """Length buckets: the indices of ``lengths`` in padded batches of at most ``batch_size``.

    In order of length (then index, for determinism), a request joins the current batch unless
    the batch is full or it would make padding more than ``max_padding`` of the batch's computed
    positions (rows x longest). Short prompts are then not padded to long ones: that padding is
    computed for nothing. ``max_padding=1`` is plain chunking by length order.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current:
            width = lengths[i]  # in length order the newcomer is the longest
            padding = sum(width - lengths[j] for j in current)
            if len(current) >= batch_size or padding > max_padding * width * (len(current) + 1):
                batches.append(current)
                current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
