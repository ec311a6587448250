"""OpenAI-compatible HTTP: one request over the wire, its retries and its errors.

One job: getting one request answered, or failed for good with an error that says why; its
parts (the policy, the attempt, the errors, the sockets an interrupt cuts) only make sense
together, and ``payload.py`` keeps what is pure.

The I/O half under ``OpenAICompatLLM`` (``openai/compat.py``); the pure half (payloads, parsing,
backoff waits) is ``openai/payload.py`` (``wire``). Here:

- the errors a caller sees: ``LLMRequestError`` (one request failed for good, after its retries)
  and ``LLMBatchError`` (some requests of a batch did; the others' completions in ``.partial``);
- the retry policy (``RetryPolicy``): connect and read timeouts apart; 408/409/425/429, every
  5xx, timeouts, dropped connections and event streams cut short are retried (``retryable``),
  with exponential backoff honouring ``Retry-After``; and a ``deadline`` on the request in all,
  so a dead server fails it in under a minute at the defaults, each retry said in one log line
  (``with_retries``). Then ``final_error`` names the URL, the attempts, the HTTP status and the
  server's last message, redacted; a refusal with no message (a 4xx with an empty body) names
  what the request carried instead: method, path, header names and payload keys, never a
  header's value;
- one attempt (``post_completion``): the POST (with an ``X-Request-ID``, a UUID), the error body
  of a failed status, and the response read whole or as server-sent events, timed (time to
  first token, then the rest); a body that is no readable completion is a ``BadResponse`` (not
  retried), a stream cut mid-event an ``IncompleteStream`` (retried), both naming the request id.
  ``on_response`` sees each answer's status and headers as soon as they arrive (the rate
  limiter, ``rate_limit.py``, reads ``x-ratelimit-*`` there); a 429 without ``Retry-After``
  waits for the reset of the window its ``x-ratelimit-*`` headers say is exhausted;
- ``Connections``: the sockets of a client's connections, so an interrupted batch can cut the
  requests in flight at once instead of waiting out their reads;
- ``redact_httpx_logs``: httpx logs each request's full URL, query and all.

httpx and tenacity are imported when first used, so importing this module imports neither.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragbench import secrets
from ragbench.llm.openai import payload as wire
from ragbench.llm.rate_limit import parse_headers
from ragbench.types import Completion

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 425, 429})  # plus every 5xx
# The defaults fail a request to a dead server in under a minute: a host that does not accept
# the connection in CONNECT_TIMEOUT, or a server silent for READ_TIMEOUT, is retried while the
# DEADLINE leaves time for it. A live host connects in milliseconds; READ_TIMEOUT is the longest
# silence of a live server (its queue and prefill before the first streamed token; the whole
# answer without streaming): a slow server (a very long prompt's prefill) needs more of both.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 25.0
DEADLINE = 55.0
MAX_RETRIES = 4
BACKOFF_BASE, BACKOFF_MAX = 0.5, 30.0
# an attempt with less time than this left before the deadline is not started: it could only
# time out
MIN_ATTEMPT_SECONDS = 1.0


class LLMRequestError(RuntimeError):
    """A request failed for good (after its retries: ``attempts``). ``partial``: index ->
    Completion of the requests of the same batch that did finish (empty for one request)."""

    def __init__(self, message: str, url: str, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.url, self.status, self.attempts = url, status, attempts
        self.partial: dict[int, Completion] = {}


class LLMBatchError(LLMRequestError):
    """Some requests of a batch failed for good, each after its own retries. ``errors``: index ->
    that request's own error; ``partial``: index -> Completion of the others. The message,
    status and attempts are those of the first failed request."""

    def __init__(
        self, partial: dict[int, Completion], errors: dict[int, BaseException], total: int
    ) -> None:
        i = min(errors)
        first = errors[i]
        what = (
            str(first) if isinstance(first, LLMRequestError) else f"{type(first).__name__}: {first}"
        )
        super().__init__(
            f"{len(errors)} of {total} requests failed; the first: {what}",
            getattr(first, "url", ""),
            getattr(first, "status", None),
            getattr(first, "attempts", 1),
        )
        self.partial, self.errors = partial, errors


class StatusError(Exception):
    """An HTTP error status, with the server's message (redacted) and its ``Retry-After``."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.retry_after = status, message, retry_after


class IncompleteStream(Exception):
    """The event stream ended without a finish reason or [DONE], or cut mid-event: treated as a
    dropped connection (retried). ``request_id``: the attempt's (``final_error`` names it)."""

    request_id: str | None = None


class BadResponse(Exception):
    """The server answered, but not with a completion we can read (not JSON, no choices, an
    error event): it would answer the same again, so it is not retried. ``request_id``: the
    attempt's (``final_error`` names it)."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


REQUEST_ID_HEADER = "X-Request-ID"  # sent with each attempt; vLLM and most gateways echo it


def new_request_id() -> str:
    """An id for one attempt, sent as ``X-Request-ID``: errors name it (or the server's own
    ``x-request-id`` when it answers with one), so a server's log line can be found.

    A random UUID (version 4): servers that validate the header want a UUID (llama-cpp-python's
    answers anything else with an empty 400), and an id names one attempt, not one request, so
    it must not repeat: a deterministic id (uuid5 of the request) would be the same for a
    request's retries, for a rerun and for two questions that send the same prompt, and a
    gateway that deduplicates by request id could answer one with another's reply."""
    return str(uuid.uuid4())


def status_error(resp, body: str, payload: dict[str, object] | None = None) -> StatusError:
    """The error for a response with status >= 400 whose body is ``body``. A 4xx that gives no
    reason (an empty body, or an empty message) is named by what the request carried
    (``wire.describe_request``: method, path, header names, ``payload``'s keys), since that is
    all there is to compare with what the server accepts."""
    message = secrets.redact_text(wire.error_message(body))  # the server may quote our key
    if not message.strip() and 400 <= resp.status_code < 500:
        message = _sent(resp, payload)
    retry_after = wire.parse_retry_after(resp.headers.get("retry-after"))
    if retry_after is None and resp.status_code == 429:  # OpenAI's headers say when, instead
        retry_after = parse_headers(resp.headers).exhausted_for()
    return StatusError(resp.status_code, message, retry_after)


def _sent(resp, payload: dict[str, object] | None) -> str:
    """``wire.describe_request`` of the request ``resp`` answers (names only: no value leaves)."""
    request = getattr(resp, "request", None)
    if request is None:
        return "(no reason given)"
    names = [k.decode("latin-1") for k, _ in request.headers.raw]
    return wire.describe_request(request.method, request.url.path, names, payload or {})


# ---------------------------------------------------------------------------- retry policy


@dataclass(frozen=True)
class RetryPolicy:
    """How long one request may wait and how often it is tried. Transport only: it changes when
    a request gives up, never what an answer means (so the config hash leaves it out)."""

    # the longest silence while reading (per read, per event when streaming)
    timeout: float = READ_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT  # to open a connection, TLS included
    max_retries: int = MAX_RETRIES  # retries of a retryable failure, after the first attempt
    backoff_base: float = BACKOFF_BASE  # the first retry's wait, doubled for each next one
    backoff_max: float = BACKOFF_MAX  # the longest wait, a server's Retry-After included
    # seconds one request may take in all, its attempts and the waits between them; a rate
    # limit's waits (the limiter's, a 429's Retry-After) are not counted: that server is alive.
    # No attempt starts, and no read waits, past it. None: only max_retries bounds the request
    deadline: float | None = DEADLINE

    def __post_init__(self) -> None:
        checks = {
            "timeout": self.timeout > 0,
            "connect_timeout": self.connect_timeout > 0,
            "max_retries": isinstance(self.max_retries, int) and self.max_retries >= 0,
            "backoff_base": self.backoff_base >= 0,
            "backoff_max": self.backoff_max >= 0,
            "deadline": self.deadline is None or self.deadline > 0,
        }
        if bad := [k for k, good in checks.items() if not good]:
            raise ValueError(
                f"{', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}: timeout, "
                "connect_timeout and deadline must be seconds > 0 (deadline may be None: no "
                "bound), max_retries a whole number >= 0, backoff_base and backoff_max >= 0"
            )

    @classmethod
    def of(cls, timeout: float, connect_timeout: float, deadline: float | None = None, **kw):
        """A policy whose ``deadline``, when not given, is ``DEADLINE`` or one whole attempt
        (connect and read timeouts) if that is longer: a default never cuts short the timeouts
        a caller asked for."""
        if deadline is None:
            deadline = max(DEADLINE, timeout + connect_timeout)
        return cls(timeout=timeout, connect_timeout=connect_timeout, deadline=deadline, **kw)


class Budget:
    """One request's clock against its policy's deadline: the time left, the timeouts of its
    next attempt (never past the deadline), and the time excused (a rate limit's waits)."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float] = time.monotonic):
        self.policy, self.clock = policy, clock
        self.start, self.excused = clock(), 0.0
        self.applied = (policy.connect_timeout, policy.timeout)  # the last attempt's timeouts
        self.excuse_next_wait = False  # the coming retry wait is a rate limit's

    def spent(self) -> float:
        """Seconds counted against the deadline so far."""
        return self.clock() - self.start - self.excused

    def left(self) -> float:
        deadline = self.policy.deadline
        return math.inf if deadline is None else deadline - self.spent()

    @contextmanager
    def excuse(self) -> Iterator[None]:
        """Time spent in the block is not counted against the deadline."""
        t0 = self.clock()
        try:
            yield
        finally:
            self.excused += self.clock() - t0

    def timeouts(self) -> httpx.Timeout:
        """The ``httpx.Timeout`` of an attempt starting now: the policy's, cut to the time
        left (a read may not wait past the deadline)."""
        import httpx

        left = max(self.left(), 0.001)
        self.applied = (min(self.policy.connect_timeout, left), min(self.policy.timeout, left))
        return httpx.Timeout(self.applied[1], connect=self.applied[0])


def retryable(exc: BaseException) -> bool:
    """Worth another attempt: 408/409/425/429 or any 5xx, a timeout or dropped connection, an
    event stream cut short. Other statuses (400, 401, 422...) would fail the same way again."""
    import httpx

    if isinstance(exc, StatusError):
        return exc.status in RETRY_STATUSES or exc.status >= 500
    return isinstance(exc, httpx.TransportError | IncompleteStream)


def _rate_limited(exc: BaseException | None) -> bool:
    return isinstance(exc, StatusError) and exc.status == 429


def with_retries(
    attempt: Callable[..., object],
    *args: object,
    policy: RetryPolicy,
    url: str,
    sleep: Callable[[float], None],
) -> tuple[object, int]:
    """``attempt(*args, budget)`` until it succeeds or fails for good: (its result, attempts
    made). ``budget`` (a ``Budget``) gives the attempt its timeouts and excuses its rate-limit
    waits. Up to ``policy.max_retries`` retries of a ``retryable`` failure, each
    ``wire.backoff_seconds`` after the last (the server's ``Retry-After`` when given), the waits
    through ``sleep``, while the deadline leaves ``MIN_ATTEMPT_SECONDS`` after the wait; each
    retry is logged in one line. The last failure is raised as ``final_error``."""
    from tenacity import Retrying, retry_if_exception

    budget = Budget(policy)

    def wait_for(state) -> float:
        ra = getattr(state.outcome.exception(), "retry_after", None)
        base, cap = policy.backoff_base, policy.backoff_max
        return wire.backoff_seconds(state.attempt_number, base, cap, ra)

    def stop(state) -> bool:  # (tenacity 8.2 asks before the wait, 9 after: computed here)
        if state.attempt_number > policy.max_retries:
            return True
        if _rate_limited(state.outcome.exception()):
            return False  # its wait is excused: the server is alive
        return budget.left() - wait_for(state) < MIN_ATTEMPT_SECONDS

    def announce(state) -> None:
        exc = state.outcome.exception()
        budget.excuse_next_wait = _rate_limited(exc)
        wait = state.next_action.sleep if state.next_action else 0.0
        left = budget.left()
        ahead = "" if math.isinf(left) else f"; {max(left, 0):.0f} s of its deadline left"
        line = (
            f"POST {url}: {_detail(exc, budget)}; retry {state.attempt_number} of "
            f"{policy.max_retries} in {wait:.1f} s{ahead}"
        )
        level = logging.DEBUG if budget.excuse_next_wait else logging.WARNING
        log.log(level, "%s", secrets.redact_text(line))

    def nap(seconds: float) -> None:
        if budget.excuse_next_wait:
            with budget.excuse():
                sleep(seconds)
        else:
            sleep(seconds)

    retrying = Retrying(
        stop=stop,
        wait=wait_for,
        retry=retry_if_exception(retryable),
        reraise=True,
        sleep=nap,
        before_sleep=announce,
    )
    try:
        result = retrying(attempt, *args, budget)
    except Exception as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise final_error(exc, attempts, url, budget) from None
    return result, retrying.statistics.get("attempt_number", 1)


def _detail(exc: BaseException, budget: Budget) -> str:
    """What went wrong in an attempt, in words (the timeout it ran under for a timeout)."""
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return f"timed out after {budget.applied[0]:.3g} s connecting (ConnectTimeout)"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {budget.applied[1]:.3g} s with no answer ({type(exc).__name__})"
    if isinstance(exc, IncompleteStream):
        return f"the event stream was cut short: {exc}"
    if isinstance(exc, httpx.TransportError):
        return f"connection failed: {type(exc).__name__}: {exc}"
    return str(exc)


def final_error(exc: Exception, attempts: int, url: str, budget: Budget) -> LLMRequestError:
    """What a caller sees of a request's last failure: the URL (already redacted), the attempts,
    the HTTP status and what went wrong, all through ``secrets.redact_text``. A request the
    deadline stopped says so, with the settings that would let a slow server answer."""
    import httpx

    status = exc.status if isinstance(exc, StatusError) else None
    detail = _detail(exc, budget)
    policy = budget.policy
    if retryable(exc) and attempts <= policy.max_retries:  # the deadline, not the count
        detail += f"; gave up after {budget.spent():.0f} s (deadline {policy.deadline:g} s)"
    if isinstance(exc, httpx.TimeoutException):
        detail += "; a server that is only slow needs a longer timeout and deadline"
    request_id = getattr(exc, "request_id", None)  # an unreadable answer: the server's log line
    where = f"POST {url} (request {request_id})" if request_id else f"POST {url}"
    msg = f"{where} failed after {attempts} attempt(s): {detail}"
    return LLMRequestError(secrets.redact_text(msg), url, status, attempts)


# ---------------------------------------------------------------------------- connections


class Connections:
    """The sockets of one client's connections, each noted as it opens (httpcore's ``trace``
    request extension: pass ``extensions`` with every request), so that an interrupted batch
    can cut its requests in flight: ``cut`` shuts every socket down, and a read blocked on one
    ends at once. Closing the client would not do: a read blocked on a socket outlives the
    socket's file being closed. The server sees its client go (vLLM then aborts the request);
    the idle kept-alive connections go too, and the pool opens new ones for the next call."""

    OPENED = ("connect_tcp.complete", "start_tls.complete", "connect_unix_socket.complete")

    def __init__(self) -> None:
        self._streams: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()

    def _trace(self, event: str, info: dict[str, object]) -> None:
        if event.endswith(self.OPENED) and info.get("return_value") is not None:
            with self._lock:
                self._streams.add(info["return_value"])

    @property
    def extensions(self) -> dict[str, object]:
        """The request extensions that note a new connection's socket here."""
        return {"trace": self._trace}

    def cut(self) -> int:
        """Shut down every connection's socket (reads and writes); how many were open."""
        with self._lock:
            streams = list(self._streams)
        cut = 0
        for stream in streams:
            sock = stream.get_extra_info("socket")
            try:
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
            except (OSError, AttributeError):  # closed already, or not a socket
                pass
        return cut


# ---------------------------------------------------------------------------- one attempt


def post_completion(
    client,
    url: str,
    payload: dict[str, object],
    endpoint: str,
    on_response: Callable[[int, object], None] | None = None,
    *,
    timeout: object = None,
    connections: Connections | None = None,
) -> tuple[wire.Parsed, float, float]:
    """One attempt: (parsed response, prefill seconds, decode seconds). Without streaming the
    whole time is decode; a failed status raises ``StatusError``. A server that answers a
    streaming request with one JSON body (it ignores ``stream``) is read as a normal completion
    (``Parsed.streamed`` False: no time to first token). A body that cannot be read raises
    ``BadResponse``, a stream cut short ``IncompleteStream`` (retried), each with the request id.
    ``on_response(status, headers)`` is called when the answer's headers arrive. ``timeout``
    (an ``httpx.Timeout``; None: the client's) bounds the attempt; ``connections`` notes the
    connection's socket, so an interrupt can cut it."""
    t0 = time.perf_counter()
    request_id = new_request_id()
    options: dict[str, object] = {"headers": {REQUEST_ID_HEADER: request_id}}
    if timeout is not None:
        options["timeout"] = timeout
    if connections is not None:
        options["extensions"] = connections.extensions
    with client.stream("POST", url, json=payload, **options) as resp:
        request_id = resp.headers.get("x-request-id") or request_id  # the server's, if it has one
        if on_response is not None:
            on_response(resp.status_code, resp.headers)
        if resp.status_code >= 400:
            raise status_error(resp, resp.read().decode("utf-8", "replace"), payload)
        ctype = resp.headers.get("content-type", "").lower()
        try:
            if payload.get("stream") and ("event-stream" in ctype or not ctype):
                return read_stream(resp.iter_lines(), t0, endpoint)
            body = resp.read().decode("utf-8", "replace")
            if payload.get("stream") and wire.looks_like_sse(body):  # mislabelled event stream
                return read_stream(body.splitlines(), t0, endpoint)
            parsed = wire.parse_response(wire.parse_json(body), endpoint)
            return parsed, 0.0, time.perf_counter() - t0
        except IncompleteStream as exc:
            exc.request_id = request_id
            raise
        except ValueError as exc:
            # an HTML page (a proxy's login or error page) is not a cut stream: say what came
            kind = ctype.split(";")[0].strip() or "untyped"
            what = (
                ""
                if "json" in ctype
                else f"a {kind} answer (HTTP {resp.status_code}), not an event stream or JSON: "
            )
            raise BadResponse(f"{what}{exc}", request_id) from None


def read_stream(lines: Iterable[str], t0: float, endpoint: str) -> tuple[wire.Parsed, float, float]:
    """A server-sent event stream (its ``lines``) to its end: the time to its first text is
    prefill (from ``t0``, so queueing and network are in it), the rest decode. A stream that
    stops without a finish reason or [DONE], or whose last event is cut off (not valid JSON),
    raises ``IncompleteStream``; an unreadable event with more after it, ``ValueError``."""
    parts: list[str] = []
    finish, usage, model, t_first = "", None, "", None
    done = False
    cut: str | None = None  # why the last event could not be read
    for n, data in enumerate(wire.iter_sse_data(lines), start=1):
        if cut is not None:  # an unreadable event, and the stream went on: not a cut
            raise ValueError(cut)
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = wire.parse_json(data, f"event {n}")
        except ValueError as exc:
            cut = str(exc)
            continue
        text, fin, use = wire.parse_chunk(chunk, endpoint)
        if text and t_first is None:
            t_first = time.perf_counter()
        parts.append(text)
        finish, usage, model = fin or finish, use or usage, chunk.get("model") or model
        done = done or bool(fin)
    t_end = time.perf_counter()
    if cut is not None:
        raise IncompleteStream(f"it ended inside an event: {cut}")
    if not done:
        raise IncompleteStream("event stream ended without a finish reason")
    t_first = t_first if t_first is not None else t_end
    parsed = wire.Parsed("".join(parts), finish, usage, model, streamed=True)
    return parsed, t_first - t0, t_end - t_first


# ---------------------------------------------------------------------------- logs


class RedactRecords(logging.Filter):
    """httpx logs each request's full URL at INFO, query included, where a token can sit."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = secrets.redact_text(record.getMessage()), ()
        return True


def redact_httpx_logs() -> None:
    """Put ``RedactRecords`` on the httpx logger, once."""
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, RedactRecords) for f in logger.filters):
        logger.addFilter(RedactRecords())
