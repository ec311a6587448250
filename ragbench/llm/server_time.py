"""A server's busy time, split among the requests that kept it busy (processor sharing).

A self-hosted server (vLLM, SGLang, TGI, ``transformers serve``) runs many requests at once: at
``max_concurrency`` 16 the requests in flight share its devices, so charging each request its
own send-to-last-byte time charges the device up to 16 times over (a loopback server busy about
1.5 s was charged 15.2 device-seconds for 24 requests at concurrency 16). Instead a request is
charged its share of the *busy time*: the wall time during which at least one of this backend's
requests was in flight. At each instant that time is divided among the requests in flight then,
in proportion to the token work each was doing (weighted processor sharing), so the shares add up
to the busy time (the price sheet then multiplies by its ``gpus``) and idle gaps between calls are
charged to nobody.

- A request's interval is its own: from sending its last (successful) attempt to its last byte.
  The harness's queue (a free worker, the rate limiter, failed attempts and their backoff) is not
  in it, and a request that failed for good is in no one's bill.
- Its token work is what the server computed for it: the prompt tokens it did not serve from its
  prefix cache plus the tokens it generated (``token_work``). When in its interval the server did
  that work is not visible from here, so it is spread evenly: the request's weight at each instant
  is its work rate, work / its own duration (``work_rate``). Weighting by the total work instead
  would let a long, slow request (2,000 generated tokens over 40 s, one token a step) take most of
  the time of every short request it overlaps, though it does little of the work then.
- ``busy_shares`` is the split itself: a pure function of (start, end, weight) intervals.
- ``BusyTimeline`` is one per backend instance and spans the run (every ``generate`` call), so
  requests of calls made from several threads at once share their overlap too. A call's shares
  are final when it returns: it waits until every request that started before its last one
  ended has ended as well (the only requests its shares depend on). The runner's calls come one
  after another, so in a run this is the timeline of each call's batch, and no call waits.

What it cannot see: other clients of the same server (another process, a Ray worker with its own
backend) and the server's real per-request device time. Those need the server's own metrics.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from ragbench.types import Completion

log = logging.getLogger(__name__)

Interval = tuple[float, float, float]  # (start, end, weight)

RESOURCE_SECONDS_BASIS = "server_busy_share"  # what a completion's resource_seconds is


def token_work(completion: Completion) -> int:
    """Tokens a server computed for one request: prompt tokens not served from its prefix cache,
    plus the tokens it generated."""
    c = completion
    return max(c.prompt_tokens - c.cached_prompt_tokens, 0) + max(c.completion_tokens, 0)


def work_rate(start: float, end: float, work: float) -> float:
    """A request's weight in ``busy_shares``: its work spread evenly over its own interval
    (0 for an empty interval, which is charged nothing anyway)."""
    return work / (end - start) if end > start else 0.0


# Hand-written: no maintained library attributes the union of overlapping intervals among them
# by weighted processor sharing (queueing packages simulate PS queues, interval packages such as
# `portion` give unions, not shares); the sweep below is short, exact and tested directly.
def busy_shares(intervals: Sequence[Interval]) -> list[float]:
    """Each interval's share of the busy time (the length of the union of the intervals): at each
    instant, the time is divided among the intervals that cover it in proportion to their weights
    (equally where all of those weights are 0). The shares add up to the length of that union;
    an interval alone pays its whole length; a gap that no interval covers is charged to none.
    ``intervals``: (start, end, weight) with end >= start and weight >= 0."""
    for i, (start, end, weight) in enumerate(intervals):
        if not end >= start or not weight >= 0:  # also NaN
            raise ValueError(
                f"interval {i}: needs end >= start and weight >= 0, got {(start, end, weight)}"
            )
    shares = [0.0] * len(intervals)
    # (time, 0 = end before 1 = start at the same time, index): the in-flight set is constant
    # between two consecutive event times
    events = sorted(
        (t, kind, i)
        for i, (start, end, _) in enumerate(intervals)
        if end > start
        for t, kind in ((start, 1), (end, 0))
    )
    active: dict[int, float] = {}  # index -> weight, in the order they started
    last = events[0][0] if events else 0.0
    for t, kind, i in events:
        if t > last and active:
            span = t - last
            total = sum(active.values())
            if total > 0:
                for j, w in active.items():
                    shares[j] += span * w / total
            else:
                for j in active:
                    shares[j] += span / len(active)
        last = t
        if kind:
            active[i] = intervals[i][2]
        else:
            del active[i]
    return shares


class BusyTimeline:
    """One backend instance's requests on its server: see the module docstring.

    A request's attempt is ``start``-ed right before it is sent and then ``finish``-ed (its end:
    its last byte, and its token work) or ``drop``-ped (it failed: charged nothing). ``shares``
    gives a call's finished requests their resource seconds."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, wait_limit: float = 600.0):
        self.clock = clock
        self.wait_limit = wait_limit  # at most this long for overlapping requests of other calls
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._flying: dict[int, float] = {}  # ticket -> start
        self._done: dict[int, tuple[float, float, float]] = {}  # ticket -> (start, end, work)
        self._settled: set[int] = set()  # finished tickets whose call has its shares

    def start(self) -> int:
        """A ticket for an attempt being sent now."""
        with self._cond:
            ticket = next(self._tickets)
            self._flying[ticket] = self.clock()
            return ticket

    def finish(self, ticket: int, end: float, work: float) -> None:
        """The attempt ended (its last byte) at ``end`` (this timeline's clock), having made the
        server do ``work`` (``token_work``)."""
        with self._cond:
            start = self._flying.pop(ticket)
            self._done[ticket] = (start, max(end, start), float(work))
            self._cond.notify_all()

    @contextmanager
    def sending(self, ticket: int | None = None) -> Iterator[int]:
        """``ticket`` (default: a new one, ``start``-ed now), ``drop``-ped if the block raises."""
        ticket = self.start() if ticket is None else ticket
        try:
            yield ticket
        except BaseException:
            self.drop(ticket)
            raise

    def drop(self, ticket: int) -> None:
        """The attempt failed: it is left out of the timeline."""
        with self._cond:
            self._flying.pop(ticket, None)
            self._cond.notify_all()

    def shares(self, tickets: Sequence[int]) -> dict[int, float]:
        """Resource seconds of each of a call's finished ``tickets``: its share of the busy time,
        split with every finished request of this backend that overlaps it (``busy_shares``).
        Waits until every request that started before the last of them ended has ended too."""
        if not tickets:
            return {}
        with self._cond:
            lo = min(self._done[t][0] for t in tickets)
            hi = max(self._done[t][1] for t in tickets)

            def settled() -> bool:
                return all(start >= hi for start in self._flying.values())

            if not self._cond.wait_for(settled, timeout=self.wait_limit):
                log.warning(
                    "server busy share: requests of another call were still in flight after "
                    "%g s; they are left out of this call's split",
                    self.wait_limit,
                )
            mine = set(tickets)
            near = [t for t, (s, e, _) in self._done.items() if (e > lo and s < hi) or t in mine]
            spans = [self._done[t] for t in near]
            split = busy_shares([(s, e, work_rate(s, e, w)) for s, e, w in spans])
            out = {t: share for t, share in zip(near, split, strict=True) if t in mine}
            self._settled.update(tickets)
            self._prune()
            return out

    def charge(self, finished: Mapping[int, tuple[Completion, int]]) -> dict[int, Completion]:
        """A call's finished requests (index -> (completion, its ticket)) with their resource
        seconds: their ``shares``."""
        shares = self.shares([ticket for _, ticket in finished.values()])
        return {
            i: dataclasses.replace(c, resource_seconds=shares[ticket])
            for i, (c, ticket) in finished.items()
        }

    def _prune(self) -> None:
        """Forget settled requests that no later split can overlap: they ended before every
        request still in flight or not yet settled started."""
        pending = list(self._flying.values())
        pending += [s for t, (s, _, _) in self._done.items() if t not in self._settled]
        horizon = min(pending, default=float("inf"))
        for t in [t for t in self._settled if self._done[t][1] <= horizon]:
            del self._done[t]
            self._settled.discard(t)
