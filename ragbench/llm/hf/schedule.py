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
    ids: list[list[int]], declared: list[int], min_shared: int
) -> list[tuple[int, list[int]]]:
    """Group requests that can share a prefix KV cache: ``[(prefix_len, [request indices])]``.

    ``declared[i]`` is the token length of request i's declared prefix (0 = none). Requests with a
    declared prefix group by its tokens; the others group by the longest common token prefix of
    neighbours in sorted order when it is at least ``min_shared`` tokens. A prefix always leaves
    one prompt token per request, whose forward pass yields the first generated token. Requests
    that share nothing form one group with prefix length 0 (plain batched prefill).
    """
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    loose: list[int] = []
    for i, n in enumerate(declared):
        n = min(n, len(ids[i]) - 1)
        if n > 0:
            by_prefix.setdefault(tuple(ids[i][:n]), []).append(i)
        else:
            loose.append(i)
    groups = [(len(key), members) for key, members in by_prefix.items()]
    alone: list[int] = []
    cluster: list[int] = []
    shared = 0
    for i in sorted(loose, key=lambda j: ids[j]) + [-1]:
        n = common_prefix_len(ids[cluster[-1]], ids[i]) if cluster and i >= 0 else 0
        if cluster and n >= min_shared:
            cluster.append(i)
            shared = min(shared, n)
            continue
        if len(cluster) > 1:
            cap = min(len(ids[j]) for j in cluster) - 1
            groups.append((min(shared, cap), sorted(cluster)))
        else:
            alone.extend(cluster)
        cluster, shared = ([i], 1 << 62) if i >= 0 else ([], 0)
    if alone:
        groups.append((0, sorted(alone)))
    return sorted(groups, key=lambda g: g[1][0])


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
