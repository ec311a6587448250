"""Client-side rate limits for a server or an API: a token bucket, and what the server says.

A hosted API limits requests per minute (RPM) and tokens per minute (TPM); a run that ignores
its limits gets 429s, retries them, and spends its time in backoff. ``RateLimiter`` is shared by
every thread of one ``OpenAICompatLLM`` (one run's batches run on its thread pool), and does two
things before each attempt (``acquire``) and one after (``observe``):

- **the configured limits** (``model.rate_limit``: ``requests_per_minute``,
  ``tokens_per_minute``): one token bucket each, refilled continuously at limit/60 per second and
  holding a tenth of a second's worth (``BURST_SECONDS``: the achieved rate over any second stays
  at the limit, as APIs that enforce per-minute limits at a finer grain want). A request
  takes 1 from the request bucket and its prompt tokens plus ``max_tokens`` from the token
  bucket (what OpenAI counts against TPM before the answer is known); ``settle`` returns the
  tokens the answer did not use. Taking *reserves*: the bucket may go negative and the caller
  sleeps until its share has refilled, outside the lock, so waiting threads are served in order
  and a request larger than the bucket still passes;
- **the server's word** (``x-ratelimit-remaining-requests/-tokens`` and
  ``x-ratelimit-reset-requests/-tokens``, OpenAI's format: ``"1s"``, ``"6m0s"``, ``"20ms"``):
  each response says how many requests and tokens are left in its window and when it resets. A
  remaining count describes the moment that request was admitted, so the sends made after it
  (``Ticket.seq``) are subtracted; when nothing is left, every thread waits for the reset. A 429
  (its ``Retry-After``, else the reset headers) pauses every thread until then, not only the
  one that got it: no retry storm. The thread that got it waits in its own retry (tenacity,
  ``openai.http.with_retries``, which honours the same ``Retry-After``), not twice.
- **a cap on the server's word** (``max_pause``; the backend passes its ``backoff_max``, which
  caps each retry's wait the same way): a ``Retry-After: 3600``, or a window that resets in an
  hour, pauses every thread ``max_pause`` seconds at most, not the hour. A server that really
  is still limiting answers the next request with another 429, which is retried and in the end
  fails that request (an error row a rerun retries): a run never stalls silently. A pause longer
  than ``PAUSE_NOTICE_SECONDS`` is logged once, when it starts, with what the server asked.

Why not a library: ``aiolimiter`` is asyncio-only and the backend is threaded; ``pyrate-limiter``
(v3) keeps one list entry per unit of weight (a TPM limit of 1M tokens is a million entries) and
has no way to drain from a server's headers; ``limits`` answers hit/miss without a wait and also
cannot be told by the server. The arithmetic here is pure (``refill``, ``reserve``,
``parse_duration``, ``parse_headers``) and the limiter takes its clock and sleep, so tests need
no real time.

On Ray (``--executor ray``), each worker builds its own backend and so its own limiter, holding
to an equal share of ``model.rate_limit`` (``experiment.executor_worker``): together they stay
under the configured limit, though one worker cannot use another's idle share. The server's
headers still pause each worker when the shared limit runs out.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# a bucket holds this many seconds of its rate (at least one request): a short burst, so a
# server that enforces its per-minute limit at a finer grain (OpenAI: 60 RPM may be 1 per
# second) sees the rate, never a minute's worth at once
BURST_SECONDS = 0.1
# a reset the server states is measured from its clock when it answered; we add this to our
# receive time so a window is never assumed open a little early
RESET_MARGIN = 0.05
# the longest the server's word pauses every thread (``RateLimiter.max_pause``): the default of
# the HTTP backend's ``backoff_max``, which caps one retry's wait the same way
MAX_PAUSE = 30.0
# a pause longer than this is logged (one line, when it starts): a run that waits says so
PAUSE_NOTICE_SECONDS = 5.0

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- pure arithmetic


@dataclass(frozen=True)
class Bucket:
    """A token bucket: ``level`` units at time ``at``, refilling ``rate`` per second up to
    ``capacity``. ``level`` may be negative: units reserved ahead of the refill."""

    rate: float
    capacity: float
    level: float
    at: float


def refill(b: Bucket, now: float) -> Bucket:
    """``b`` as it stands at ``now`` (never above ``capacity``)."""
    level = min(b.capacity, b.level + max(0.0, now - b.at) * b.rate)
    return Bucket(b.rate, b.capacity, level, max(now, b.at))


def reserve(b: Bucket, amount: float, now: float) -> tuple[Bucket, float]:
    """Take ``amount`` at ``now``: (the bucket after, seconds the taker must wait for the
    refill to cover it: 0 when it was there)."""
    b = refill(b, now)
    level = b.level - amount
    wait = 0.0 if level >= 0 else -level / b.rate
    return Bucket(b.rate, b.capacity, level, b.at), wait


def give_back(b: Bucket, amount: float, now: float) -> Bucket:
    """Return ``amount`` reserved but not used (never above ``capacity``)."""
    b = refill(b, now)
    return Bucket(b.rate, b.capacity, min(b.capacity, b.level + amount), b.at)


def per_minute_bucket(per_minute: float, now: float, burst: float = BURST_SECONDS) -> Bucket:
    """A full bucket for a per-minute limit, holding ``burst`` seconds of it (at least 1)."""
    if per_minute <= 0:
        raise ValueError(f"a per-minute limit must be > 0, got {per_minute}")
    rate = per_minute / 60.0
    capacity = max(1.0, rate * burst)
    return Bucket(rate, capacity, capacity, now)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(value: str | None) -> float | None:
    """OpenAI's reset durations in seconds: ``"6m0s"`` -> 360, ``"1s"`` -> 1, ``"20ms"`` ->
    0.02, ``"1h2m3.5s"``; a bare number is seconds. None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip().lower()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * unit[u] for n, u in parts)


@dataclass(frozen=True)
class ServerLimits:
    """What one response's ``x-ratelimit-*`` headers say (None: not sent)."""

    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests: float | None = None  # seconds until the request window is full again
    reset_tokens: float | None = None

    def exhausted_for(self) -> float | None:
        """Seconds until a window with nothing left resets (the longer of the two when both
        are out); None when neither is out or its reset is unknown."""
        waits = [
            reset
            for left, reset in (
                (self.remaining_requests, self.reset_requests),
                (self.remaining_tokens, self.reset_tokens),
            )
            if left is not None and left <= 0 and reset is not None
        ]
        return max(waits) if waits else None


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def parse_headers(headers: Mapping[str, str]) -> ServerLimits:
    """The rate-limit headers of a response (any case), as OpenAI sends them."""
    h = {k.lower(): v for k, v in headers.items()}
    return ServerLimits(
        remaining_requests=_int(h.get("x-ratelimit-remaining-requests")),
        remaining_tokens=_int(h.get("x-ratelimit-remaining-tokens")),
        reset_requests=parse_duration(h.get("x-ratelimit-reset-requests")),
        reset_tokens=parse_duration(h.get("x-ratelimit-reset-tokens")),
    )


# ---------------------------------------------------------------------------- the limiter


@dataclass(frozen=True)
class Ticket:
    """One admitted attempt: its place in the send order and the tokens it reserved."""

    seq: int  # requests sent before it
    tokens_before: int  # tokens reserved before it
    tokens: int


@dataclass
class _Window:
    """The server's window for one unit, as its newest answer described it."""

    left: float | None = None  # what we may still send before ``reset_at`` (None: unknown)
    reset_at: float = 0.0
    newest: int = -1  # the seq of the request whose answer set it


class RateLimiter:
    """Shared by all threads of one backend: ``acquire`` before each attempt (it sleeps as the
    limits require), ``observe`` with each answer's status and headers, ``settle`` with the
    tokens used. ``requests_per_minute``/``tokens_per_minute`` None: only the server's headers
    limit. ``clock`` and ``sleep`` are injectable (tests)."""

    def __init__(
        self,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        burst_seconds: float = BURST_SECONDS,
        max_pause: float = MAX_PAUSE,  # the longest a 429 or an exhausted window pauses
    ) -> None:
        if not max_pause >= 0:
            raise ValueError(f"max_pause must be >= 0 seconds, got {max_pause!r}")
        self.requests_per_minute, self.tokens_per_minute = requests_per_minute, tokens_per_minute
        self.max_pause = max_pause
        self.clock, self.sleep = clock, sleep
        now = clock()
        rpm, tpm = requests_per_minute, tokens_per_minute
        self._requests = per_minute_bucket(rpm, now, burst_seconds) if rpm else None
        self._tokens = per_minute_bucket(tpm, now, burst_seconds) if tpm else None
        self._lock = threading.Lock()
        self._seq = 0
        self._tokens_sent = 0
        self._windows = {"requests": _Window(), "tokens": _Window()}
        self._paused_until = 0.0
        self._noticed_until = 0.0  # the end of the last pause logged (one line per pause)
        self._local = threading.local()  # per thread: the pause its own retry wait serves
        self.waited = 0.0  # seconds spent waiting in acquire, all threads together
        self.pauses = 0  # times the server's headers or a 429 paused every thread

    @classmethod
    def of(cls, spec: RateLimiter | Mapping[str, Any] | None, **kw: Any) -> RateLimiter:
        """A limiter from a ``model.rate_limit`` mapping (``requests_per_minute``,
        ``tokens_per_minute``), an existing one (shared between backends), or None (only the
        server's headers limit); ``kw`` (clock, sleep, max_pause) for a new one."""
        if isinstance(spec, RateLimiter):
            return spec
        spec = dict(spec or {})
        valid = ("requests_per_minute", "tokens_per_minute")
        for key in spec:
            if key not in valid:
                raise ValueError(f"rate_limit takes no {key!r}; valid: {', '.join(valid)}")
        return cls(**{k: v for k, v in spec.items() if v is not None}, **kw)

    def _server_wait(self, now: float, served: float, tokens: int) -> float:
        """Seconds until the server's windows admit one more request of ``tokens``, for a
        thread that has already waited until ``served`` (its clock may lag: tests' sleeps)."""
        t = max(now, served)
        wait = max(0.0, self._paused_until - t)
        for unit, need in (("requests", 1), ("tokens", tokens)):
            w = self._windows[unit]
            if w.left is None:
                continue
            if now >= w.reset_at:
                w.left = None  # the window reset: unknown until the next answer says
            elif w.left < need:
                wait = max(wait, w.reset_at - t)
        return wait

    def acquire(self, tokens: int = 0) -> Ticket:
        """Wait until one request of ``tokens`` (prompt + max_tokens) may be sent; its ticket."""
        # a wait already served counts even if the clock lags it (a no-op ``sleep`` in tests must
        # not spin until the real clock catches up); a thread whose 429 set the pause has served
        # it in its own retry wait (``openai.http.with_retries``)
        served = getattr(self._local, "served_until", float("-inf"))
        self._local.served_until = float("-inf")
        while True:
            with self._lock:
                now = self.clock()
                server_wait = self._server_wait(now, served, tokens)
                if server_wait <= 0:
                    wait = 0.0
                    if self._requests is not None:
                        self._requests, w = reserve(self._requests, 1, now)
                        wait = max(wait, w)
                    if self._tokens is not None and tokens:
                        self._tokens, w = reserve(self._tokens, tokens, now)
                        wait = max(wait, w)
                    ticket = Ticket(self._seq, self._tokens_sent, tokens)
                    self._seq += 1
                    self._tokens_sent += tokens
                    for unit, n in (("requests", 1), ("tokens", tokens)):
                        window = self._windows[unit]
                        if window.left is not None:
                            window.left -= n
                    self.waited += wait
                    break
                self.waited += server_wait
            self.sleep(server_wait)
            served = max(now, served) + server_wait
        if wait > 0:
            self.sleep(wait)
        return ticket

    def _pause(self, asked: float, now: float, why: str) -> float:
        """The server asked every thread to wait ``asked`` seconds (``why``): the wait, capped
        at ``max_pause``; a long one is logged once, when it starts. Under the lock."""
        wait = min(asked, self.max_pause)
        if wait > PAUSE_NOTICE_SECONDS and now >= self._noticed_until:
            capped = f" (capped at {self.max_pause:g} s)" if asked > wait else ""
            log.warning("server asked to pause %.0f s%s: %s", asked, capped, why)
            self._noticed_until = now + wait
        return wait

    def observe(
        self, ticket: Ticket, status: int, headers: Mapping[str, str], retry_after: float | None
    ) -> None:
        """What an answer to ``ticket`` said: its ``x-ratelimit-*`` headers update the server's
        windows (from the newest request that reported them); a 429 pauses every thread until
        its ``retry_after`` (or, without one, the reset of the exhausted window)."""
        limits = parse_headers(headers)
        with self._lock:
            now = self.clock()
            for unit, left, reset, sent_since in (
                (
                    "requests",
                    limits.remaining_requests,
                    limits.reset_requests,
                    self._seq - ticket.seq - 1,
                ),
                (
                    "tokens",
                    limits.remaining_tokens,
                    limits.reset_tokens,
                    self._tokens_sent - ticket.tokens_before - ticket.tokens,
                ),
            ):
                w = self._windows[unit]
                if left is None or reset is None or ticket.seq < w.newest:
                    continue
                if left - sent_since <= 0 and status != 429:  # every thread waits for the reset
                    why = f"x-ratelimit-remaining-{unit}: {left}, resets in {reset:g} s"
                    reset = self._pause(reset, now, why)
                w.left, w.reset_at, w.newest = (
                    left - sent_since,
                    now + min(reset, self.max_pause) + RESET_MARGIN,
                    ticket.seq,
                )
            if status == 429:
                wait = retry_after if retry_after is not None else limits.exhausted_for()
                if wait is not None:
                    why = "HTTP 429" + (" Retry-After" if retry_after is not None else "")
                    wait = self._pause(wait, now, why)
                    self._local.served_until = now + wait  # this thread's retry waits it
                    if now + wait > self._paused_until:
                        self._paused_until = now + wait
                        self.pauses += 1

    def settle(self, ticket: Ticket, used_tokens: int | None) -> None:
        """The answer used ``used_tokens`` of the ``ticket.tokens`` reserved: the rest goes back
        to the token bucket (None: unknown, nothing goes back)."""
        if self._tokens is None or used_tokens is None or used_tokens >= ticket.tokens:
            return
        with self._lock:
            self._tokens = give_back(self._tokens, ticket.tokens - used_tokens, self.clock())
