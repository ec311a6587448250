"""OpenAI-compatible HTTP: one request over the wire, its retries and its errors.

The I/O half under ``OpenAICompatLLM`` (``openai/compat.py``); the pure half (payloads, parsing,
backoff waits) is ``openai/payload.py`` (``wire``). Here:

- the errors a caller sees: ``LLMRequestError`` (one request failed for good, after its retries)
  and ``LLMBatchError`` (some requests of a batch did; the others' completions in ``.partial``);
- the retry policy: 408/409/425/429, every 5xx, timeouts, dropped connections and event streams
  cut short are retried (``retryable``), with exponential backoff honouring ``Retry-After``
  (``with_retries``); then ``final_error`` names the URL, the attempts, the HTTP status and the
  server's last message, redacted;
- one attempt (``post_completion``): the POST (with an ``X-Request-ID``), the error body of a
  failed status, and the response read whole or as server-sent events, timed (time to first
  token, then the rest); a body that is no readable completion is a ``BadResponse`` (not
  retried), a stream cut mid-event an ``IncompleteStream`` (retried), both naming the request id.
  ``on_response`` sees each answer's status and headers as soon as they arrive (the rate
  limiter, ``rate_limit.py``, reads ``x-ratelimit-*`` there); a 429 without ``Retry-After``
  waits for the reset of the window its ``x-ratelimit-*`` headers say is exhausted;
- ``redact_httpx_logs``: httpx logs each request's full URL, query and all.

httpx and tenacity are imported when first used, so importing this module imports neither.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ragbench import secrets
from ragbench.llm.openai import payload as wire
from ragbench.llm.rate_limit import parse_headers
from ragbench.types import Completion

RETRY_STATUSES = frozenset({408, 409, 425, 429})  # plus every 5xx


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

    def __init__(self, partial: dict[int, Completion], errors: dict[int, Exception], total: int):
        i = min(errors)
        first = errors[i]
        what = (
            str(first) if isinstance(first, LLMRequestError) else f"{type(first).__name__}: {first}"
        )
        super().__init__(
            f"{len(errors)} of {total} requests failed; the first: {what}",
            getattr(first, "url", ""), getattr(first, "status", None),
            getattr(first, "attempts", 1),
        )  # fmt: skip
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
    ``x-request-id`` when it answers with one), so a server's log line can be found."""
    return f"ragbench-{uuid.uuid4().hex[:16]}"


def status_error(resp, body: str) -> StatusError:
    """The error for a response with status >= 400 whose body is ``body``."""
    message = secrets.redact_text(wire.error_message(body))  # the server may quote our key
    retry_after = wire.parse_retry_after(resp.headers.get("retry-after"))
    if retry_after is None and resp.status_code == 429:  # OpenAI's headers say when, instead
        retry_after = parse_headers(resp.headers).exhausted_for()
    return StatusError(resp.status_code, message, retry_after)


# ---------------------------------------------------------------------------- retries


def retryable(exc: BaseException) -> bool:
    """Worth another attempt: 408/409/425/429 or any 5xx, a timeout or dropped connection, an
    event stream cut short. Other statuses (400, 401, 422...) would fail the same way again."""
    import httpx

    if isinstance(exc, StatusError):
        return exc.status in RETRY_STATUSES or exc.status >= 500
    return isinstance(exc, httpx.TransportError | IncompleteStream)


def with_retries(
    attempt: Callable[..., Any],
    *args: Any,
    url: str,
    timeout: float,
    max_retries: int,
    backoff_base: float,
    backoff_max: float,
    sleep: Callable[[float], None],
) -> tuple[Any, int]:
    """``attempt(*args)`` until it succeeds or fails for good: (its result, attempts made).
    Up to ``max_retries`` retries of a ``retryable`` failure, ``wire.backoff_seconds`` apart
    (the server's ``Retry-After`` when given), the waits through ``sleep``. The last failure
    is raised as ``final_error(..., url, timeout)``."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt

    def wait_for(state) -> float:
        ra = getattr(state.outcome.exception(), "retry_after", None)
        return wire.backoff_seconds(state.attempt_number, backoff_base, backoff_max, ra)

    retrying = Retrying(
        stop=stop_after_attempt(max_retries + 1),
        wait=wait_for,
        retry=retry_if_exception(retryable),
        reraise=True,
        sleep=sleep,
    )
    try:
        result = retrying(attempt, *args)
    except Exception as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise final_error(exc, attempts, url, timeout) from None
    return result, retrying.statistics.get("attempt_number", 1)


def final_error(exc: Exception, attempts: int, url: str, timeout: float) -> LLMRequestError:
    """What a caller sees of a request's last failure: the URL (already redacted), the attempts,
    the HTTP status and what went wrong, all through ``secrets.redact_text``."""
    import httpx

    status = exc.status if isinstance(exc, StatusError) else None
    if isinstance(exc, httpx.TimeoutException):
        detail = f"timed out after {timeout:g} s ({type(exc).__name__})"
    elif isinstance(exc, IncompleteStream):
        detail = f"the event stream was cut short: {exc}"
    elif isinstance(exc, httpx.TransportError):
        detail = f"connection failed: {type(exc).__name__}: {exc}"
    else:
        detail = str(exc)
    request_id = getattr(exc, "request_id", None)  # an unreadable answer: the server's log line
    where = f"POST {url} (request {request_id})" if request_id else f"POST {url}"
    msg = f"{where} failed after {attempts} attempt(s): {detail}"
    return LLMRequestError(secrets.redact_text(msg), url, status, attempts)


# ---------------------------------------------------------------------------- one attempt


def post_completion(
    client,
    url: str,
    payload: dict[str, Any],
    endpoint: str,
    on_response: Callable[[int, Any], None] | None = None,
) -> tuple[wire.Parsed, float, float]:
    """One attempt: (parsed response, prefill seconds, decode seconds). Without streaming the
    whole time is decode; a failed status raises ``StatusError``. A server that answers a
    streaming request with one JSON body (it ignores ``stream``) is read as a normal completion
    (``Parsed.streamed`` False: no time to first token). A body that cannot be read raises
    ``BadResponse``, a stream cut short ``IncompleteStream`` (retried), each with the request id.
    ``on_response(status, headers)`` is called when the answer's headers arrive."""
    t0 = time.perf_counter()
    request_id = new_request_id()
    with client.stream("POST", url, json=payload, headers={REQUEST_ID_HEADER: request_id}) as resp:
        request_id = resp.headers.get("x-request-id") or request_id  # the server's, if it has one
        if on_response is not None:
            on_response(resp.status_code, resp.headers)
        if resp.status_code >= 400:
            raise status_error(resp, resp.read().decode("utf-8", "replace"))
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
