"""OpenAI-compatible HTTP backend: vLLM, SGLang, TGI, `transformers serve` and hosted APIs.

Payload building and response parsing are pure functions in ``openai_payload.py`` (``wire``);
``OpenAICompatLLM`` does the I/O around them:

- chat (``/v1/chat/completions``) or completions (``/v1/completions``) endpoint;
- base URL, model and key from arguments or the environment (``OPENAI_BASE_URL``,
  ``RAGBENCH_API_KEY`` or ``OPENAI_API_KEY``, ``OPENAI_MODEL``). The key lives only in the HTTP
  client's headers: never in ``identity()``, ``repr``, completions, logs or exception messages;
- a batch runs on a thread pool of ``max_concurrency`` workers sharing one ``httpx.Client``;
- each request retries with exponential backoff (tenacity) on 408/429/5xx, timeouts and dropped
  connections, honouring ``Retry-After`` (the waits go through ``sleep``, which tests replace);
  then a ``LLMRequestError`` names the URL, the HTTP status and the server's last message. A
  failed request never yields a partial ``Completion``; the error carries the batch's finished
  completions in ``.partial`` (the cache stores them);
- latency: with ``stream=True`` (default) the server-sent events give time to first token
  (``prefill_seconds``, which includes queueing and network) and the rest is ``decode_seconds``.
  Without streaming only the total is known: it goes to ``decode_seconds`` and
  ``meta["ttft_measured"]`` is False;
- usage from the response, cached prompt tokens from ``prompt_tokens_details.cached_tokens``;
  when a server reports none, tokens are counted locally and ``usage_estimated`` is True.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from ragbench.llm import openai_payload as wire
from ragbench.llm.base import LLM
from ragbench.types import Completion, GenerationRequest

KEY_ENV = ("RAGBENCH_API_KEY", "OPENAI_API_KEY")
RETRY_STATUSES = frozenset({408, 409, 425, 429})  # plus every 5xx


class LLMRequestError(RuntimeError):
    """A request failed for good (after retries). ``partial``: index -> Completion of the
    requests of the same batch that did finish."""

    def __init__(self, message: str, url: str, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.url, self.status, self.attempts = url, status, attempts
        self.partial: dict[int, Completion] = {}


class _StatusError(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.retry_after = status, message, retry_after


class _IncompleteStream(Exception):
    """The event stream ended without a finish reason or [DONE]: treated as a dropped connection."""


# ---------------------------------------------------------------------------- retry policy


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    now = now or datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


def backoff_seconds(attempt: int, base: float, cap: float, retry_after: float | None) -> float:
    """Wait before retry number ``attempt`` (1 = first retry): the server's ``Retry-After`` when
    given (capped), else ``base * 2**(attempt-1)`` capped."""
    if retry_after is not None:
        return min(retry_after, cap)
    return min(cap, base * 2 ** (attempt - 1))


def _retryable(exc: BaseException) -> bool:
    import httpx

    if isinstance(exc, _StatusError):
        return exc.status in RETRY_STATUSES or exc.status >= 500
    return isinstance(exc, httpx.TransportError | _IncompleteStream)


# ---------------------------------------------------------------------------- the backend


class OpenAICompatLLM(LLM):
    """An OpenAI-compatible server. ``tokenizer`` (a preset name or folder for
    ``ragbench.tokenizers.get_tokenizer``) counts tokens for the window check and when a server
    reports no usage; without it a rough 4-characters-per-token estimate is used."""

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        endpoint: str = "chat",
        context_window: int = 8192,
        tokenizer: str | None = None,
        max_concurrency: int = 8,
        timeout: float = 120.0,  # seconds per read (per event when streaming) and per connect
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        stream: bool = True,
        revision: str = "",  # weights revision/hash, for cache keys (the server can't tell us)
        sleep: Callable[[float], None] = time.sleep,  # waits between retries; tests pass a no-op
    ) -> None:
        model = model or os.environ.get("OPENAI_MODEL")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not model:
            raise ValueError("OpenAICompatLLM needs a model: pass model= or set OPENAI_MODEL")
        if not base_url:
            raise ValueError(
                "OpenAICompatLLM needs a server: pass base_url= (e.g. http://127.0.0.1:8000/v1) "
                "or set OPENAI_BASE_URL"
            )
        if max_concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("max_concurrency must be >= 1, max_retries >= 0 and timeout > 0")
        self.url = wire.endpoint_url(base_url, endpoint)  # validates endpoint and URL
        self.base_url = wire.safe_url(base_url)
        self.name, self.model, self.endpoint = model, model, endpoint
        self.context_window, self.timeout = context_window, timeout
        self.max_concurrency, self.max_retries = max_concurrency, max_retries
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.stream, self.revision, self.tokenizer_name = stream, revision, tokenizer
        self.sleep = sleep
        self._tokenizer = None
        self._has_key = bool(api_key or any(os.environ.get(k) for k in KEY_ENV))
        # The key goes straight into the client's headers (httpx shows them as [secure]) and a
        # redaction closure; it is never an attribute, so vars() and repr cannot show it.
        self._client, self._redact = self._make_client(api_key)
        self._lock = threading.Lock()

    def _make_client(self, api_key: str | None):
        import httpx

        key = api_key or next((os.environ[k] for k in KEY_ENV if os.environ.get(k)), None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=self.max_concurrency)
        client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)),
            limits=limits,
        )  # fmt: skip
        return client, lambda text: wire.redact(str(text), key)

    def __repr__(self) -> str:
        key = "'***'" if self._has_key else "None"
        return f"OpenAICompatLLM(model={self.model!r}, url={self.url!r}, api_key={key})"

    def identity(self) -> dict[str, Any]:
        return {
            "backend": "openai",
            "host": urlsplit(self.url).netloc,
            "model": self.model,
            "endpoint": self.endpoint,
            "revision": self.revision,
        }

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ token counting

    def count_tokens(self, text: str) -> int:
        if self.tokenizer_name is None:
            return math.ceil(len(text) / 4)
        if self._tokenizer is None:
            from ragbench.tokenizers import get_tokenizer

            with self._lock:
                self._tokenizer = self._tokenizer or get_tokenizer(self.tokenizer_name)
        return self._tokenizer.count(text)

    # ------------------------------------------------------------------ generation

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        if len(requests) == 1:
            return [self._request(requests[0])]
        results: dict[int, Completion] = {}
        with ThreadPoolExecutor(min(self.max_concurrency, len(requests))) as pool:
            futures = {pool.submit(self._request, r): i for i, r in enumerate(requests)}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()
            done |= wait(pending)[0] if pending else set()
            errors = []
            for f in done:
                if f.cancelled():
                    continue
                if f.exception() is None:
                    results[futures[f]] = f.result()
                else:
                    errors.append((futures[f], f.exception()))
        if errors:
            _, exc = min(errors, key=lambda e: e[0])
            exc.partial = results
            raise exc
        return [results[i] for i in range(len(requests))]

    def _request(self, request: GenerationRequest) -> Completion:
        from tenacity import Retrying, retry_if_exception, stop_after_attempt

        def wait_for(state) -> float:
            exc = state.outcome.exception()
            ra = getattr(exc, "retry_after", None)
            return backoff_seconds(state.attempt_number, self.backoff_base, self.backoff_max, ra)

        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_for,
            retry=retry_if_exception(_retryable),
            reraise=True,
            sleep=self.sleep,
        )
        payload = wire.build_payload(request, self.model, self.endpoint, self.stream)
        try:
            parsed, prefill, decode = retrying(self._post, payload)
        except Exception as exc:
            raise self._final_error(exc, retrying.statistics.get("attempt_number", 1)) from None
        attempts = retrying.statistics.get("attempt_number", 1)
        return self._completion(request, parsed, prefill, decode, attempts)

    def _final_error(self, exc: Exception, attempts: int) -> LLMRequestError:
        import httpx

        status = exc.status if isinstance(exc, _StatusError) else None
        if isinstance(exc, httpx.TimeoutException):
            detail = f"timed out after {self.timeout:g} s ({type(exc).__name__})"
        elif isinstance(exc, httpx.TransportError | _IncompleteStream):
            detail = f"connection failed: {type(exc).__name__}: {exc}"
        else:
            detail = str(exc)
        msg = f"POST {self.url} failed after {attempts} attempt(s): {detail}"
        return LLMRequestError(self._redact(msg), self.url, status, attempts)

    def _post(self, payload: dict[str, Any]) -> tuple[wire.Parsed, float, float]:
        """One attempt: (parsed response, prefill seconds, decode seconds)."""
        t0 = time.perf_counter()
        with self._client.stream("POST", self.url, json=payload) as resp:
            if resp.status_code >= 400:
                body = resp.read().decode("utf-8", "replace")
                retry_after = parse_retry_after(resp.headers.get("retry-after"))
                raise _StatusError(
                    resp.status_code, self._redact(wire.error_message(body)), retry_after
                )
            if not payload.get("stream"):
                body = resp.read()
                parsed = wire.parse_response(json.loads(body), self.endpoint)
                return parsed, 0.0, time.perf_counter() - t0
            return self._read_stream(resp, t0)

    def _read_stream(self, resp, t0: float) -> tuple[wire.Parsed, float, float]:
        parts: list[str] = []
        finish, usage, model, t_first = "", None, "", None
        done = False
        for data in wire.iter_sse_data(resp.iter_lines()):
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            text, fin, use = wire.parse_chunk(chunk, self.endpoint)
            if text and t_first is None:
                t_first = time.perf_counter()
            parts.append(text)
            finish, usage, model = fin or finish, use or usage, chunk.get("model") or model
            done = done or bool(fin)
        t_end = time.perf_counter()
        if not done:
            raise _IncompleteStream("event stream ended without a finish reason")
        t_first = t_first if t_first is not None else t_end
        return wire.Parsed("".join(parts), finish, usage, model), t_first - t0, t_end - t_first

    def _completion(
        self,
        request: GenerationRequest,
        parsed: wire.Parsed,
        prefill: float,
        decode: float,
        attempts: int,
    ) -> Completion:
        text = wire.apply_stop(parsed.text, request.stop)
        counts = wire.usage_counts(parsed.usage)
        estimated = counts is None
        if counts is None:
            counts = (self.prompt_tokens(request), self.count_tokens(parsed.text), 0)
        meta: dict[str, Any] = {
            "endpoint": self.endpoint,
            "attempts": attempts,
            "ttft_measured": bool(self.stream),
            "latency_seconds": prefill + decode,
        }
        if estimated:
            meta["token_counter"] = self.tokenizer_name or "chars/4"
        if text != parsed.text:
            meta["stop_applied_locally"] = True
        return Completion(
            text=text,
            prompt_tokens=counts[0],
            completion_tokens=counts[1],
            cached_prompt_tokens=counts[2],
            prefill_seconds=prefill,
            decode_seconds=decode,
            finish_reason=parsed.finish_reason,
            model=parsed.model or self.model,
            usage_estimated=estimated,
            meta=meta,
        )
