"""OpenAI-compatible HTTP: the pure half (lm-evaluation-harness style), no I/O.

Endpoint URLs (and the credentials a base URL carries), the JSON body of a request, the
text/finish reason/usage of a response or of one server-sent event, the server's message from an
error body, the retry policy's waits, extra headers checked. The transport (``openai/http.py``,
``openai/compat.py``) calls these; the tests call them directly. Redaction is
``ragbench.secrets``'s job.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ragbench.registry import unknown
from ragbench.types import GenerationRequest

ENDPOINTS = {"chat": "/chat/completions", "completions": "/completions"}
# where the API key comes from when none is passed, first set wins
KEY_ENV = ("RAGBENCH_API_KEY", "OPENAI_API_KEY")


def api_root(base_url: str) -> str:
    """``http://user:pw@h:8000/v1/?q=1`` -> ``http://h:8000/v1``: where the API's paths hang, with
    no userinfo and no query (those are credentials or per-request parameters, handled apart)."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url must look like http://host:port/v1, got {safe_url(base_url)!r}")
    try:
        parts.port  # noqa: B018 (parsing it is the check: 'notaport' or 99999 raise)
    except ValueError:
        raise ValueError(
            f"base_url must look like http://host:port/v1 with a port in 0..65535, got "
            f"{safe_url(base_url)!r}"
        ) from None
    return urlunsplit(
        (parts.scheme, _host_port(parts.netloc), parts.path.rstrip("/") or "/v1", "", "")
    )


def endpoint_url(base_url: str, endpoint: str) -> str:
    """``http://h:8000`` or ``http://h:8000/v1`` -> ``http://h:8000/v1/chat/completions`` (no
    userinfo, no query: see ``api_root``)."""
    if endpoint not in ENDPOINTS:
        raise unknown("endpoint", endpoint, ENDPOINTS)
    return api_root(base_url) + ENDPOINTS[endpoint]


@dataclass(frozen=True)
class Credentials:
    """What a base URL carries besides its address: ``user:password@`` and the query string."""

    username: str | None
    password: str | None
    query: tuple[tuple[str, str], ...]  # in order, repeats kept (api-version=..., token=...)


def url_credentials(base_url: str) -> Credentials:
    """The userinfo (percent-decoded, as HTTP Basic auth wants it) and query pairs of a URL."""
    parts = urlsplit(base_url.strip())
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return Credentials(user, password, tuple(parse_qsl(parts.query, keep_blank_values=True)))


def with_query(url: str, query: Iterable[tuple[str, str]]) -> str:
    """``url`` with these query pairs (what is actually requested)."""
    q = urlencode(list(query))
    return f"{url}?{q}" if q else url


def _host_port(netloc: str) -> str:
    return netloc.rpartition("@")[2]  # keeps [::1] brackets and the port exactly as written


def safe_url(url: str) -> str:
    """The URL without user:password@ and without a query string (both can carry secrets)."""
    p = urlsplit(url)
    return urlunsplit((p.scheme, _host_port(p.netloc), p.path, "", ""))


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Extra headers as a plain dict of strings (a config may hold anything)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ValueError(
            f"headers must map header names to string values, got a {type(headers).__name__}"
        )
    for k, v in headers.items():  # the values are secrets: named by type, never shown
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(
                f"headers must map header names to string values; header {k!r} is a "
                f"{type(v).__name__}"
                if isinstance(k, str)
                else f"headers must map header names to string values; a name is a {type(k).__name__}"
            )
    return dict(headers)


def build_payload(
    request: GenerationRequest, model: str, endpoint: str = "chat", stream: bool = False
) -> dict[str, object]:
    """The JSON body for one request. Greedy is temperature 0; ``max_tokens`` and ``stop`` as
    given; the completions endpoint gets the system text prepended (as ``LLM.prompt_tokens``).
    A request that samples (temperature > 0) carries a ``seed`` from its own content, as the
    transformers backend seeds its generator: a server that honours it (vLLM, llama.cpp,
    OpenAI's best effort) gives the same sample for the same request (a judge's repeats are
    distinct requests, so each has its own seed)."""
    payload: dict[str, object] = {"model": model}
    if endpoint == "chat":
        messages = [{"role": "system", "content": request.system}] if request.system else []
        payload["messages"] = [*messages, {"role": "user", "content": request.prompt}]
    elif endpoint == "completions":
        payload["prompt"] = request.system + request.prompt
    else:
        raise unknown("endpoint", endpoint, ENDPOINTS)
    payload["max_tokens"] = request.max_new_tokens
    payload["temperature"] = request.temperature
    if request.temperature > 0:
        digest = hashlib.sha256(request.to_json().encode("utf-8")).hexdigest()
        payload["seed"] = int(digest[:8], 16) & 0x7FFFFFFF  # a non-negative 31-bit int
    if request.stop:
        payload["stop"] = list(request.stop)
    if stream:
        payload["stream"] = True
        # usage in the last event (vLLM, OpenAI)
        payload["stream_options"] = {"include_usage": True}
    return payload


def payload_text(payload: dict[str, Any]) -> str:
    """The text a payload sends, untemplated: its messages' contents in order (the system text,
    then the user's: ``LLM.prompt_tokens``'s text) or its ``prompt``."""
    if "messages" in payload:
        return "".join(str(m.get("content") or "") for m in payload["messages"])
    return str(payload.get("prompt") or "")


def describe_request(
    method: str, path: str, header_names: Iterable[str], payload: Mapping[str, object]
) -> str:
    """What a refused request carried, for a server that gave no reason: its method, path
    (no query: it can hold a token), header names and payload keys. Never a header's value nor
    a payload's values (credentials, a long prompt)."""
    names = ", ".join(sorted(dict.fromkeys(header_names), key=str.lower)) or "none"
    keys = ", ".join(sorted(payload)) or "none"
    return (
        f"(the server gave no reason) {method} {path} carried the headers {names} and the "
        f"payload keys {keys}; one of them is what this server refuses (llama-cpp-python's, "
        "for one, refuses an X-Request-ID that is not a UUID)"
    )


@dataclass(frozen=True)
class Parsed:
    text: str
    finish_reason: str
    usage: dict[str, object] | None
    model: str = ""
    streamed: bool = False  # read from server-sent events: the time to first token is known


def _choice_text(choice: dict[str, Any], endpoint: str, delta: bool) -> str:
    if endpoint == "chat":
        msg = choice.get("delta" if delta else "message") or {}
        return msg.get("content") or ""
    return choice.get("text") or ""


def snippet(text: str, limit: int = 200) -> str:
    """The start of a response body for an error message, on one line."""
    flat = " ".join(text.split())
    return repr(flat[:limit] + ("..." if len(flat) > limit else ""))


def parse_json(text: str, what: str = "response") -> Any:
    """``json.loads(text)``; a body that is not JSON raises a ``ValueError`` saying where it
    broke and how the body starts (an HTML error page from a proxy, a truncated answer)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg}: line {exc.lineno} column {exc.colno}"  # as json words it
        raise ValueError(f"{what} is not valid JSON ({where}): {snippet(text)}") from None


def looks_like_sse(text: str) -> bool:
    """Whether a body is a server-sent event stream (its first line a ``data:``, ``event:``,
    ``id:`` field or a ``:`` comment), whatever its content type says."""
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith(("data:", "event:", "id:", ":"))


def parse_response(body: object, endpoint: str = "chat") -> Parsed:
    """Text, finish reason and usage of a non-streamed response."""
    if not isinstance(body, dict):
        raise ValueError(f"response is not a JSON object: {snippet(json.dumps(body))}")
    if "error" in body and not body.get("choices"):
        raise ValueError(f"server returned an error object: {error_message(json.dumps(body))}")
    choices = body.get("choices")
    if not choices:
        raise ValueError(f"response has no choices: {json.dumps(body)[:300]}")
    choice = choices[0]
    if not isinstance(choices, list) or not isinstance(choice, dict):
        raise ValueError(f"response choices are not objects: {snippet(json.dumps(body))}")
    return Parsed(
        text=_choice_text(choice, endpoint, delta=False),
        finish_reason=choice.get("finish_reason") or "",
        usage=body.get("usage") or None,
        model=body.get("model") or "",
    )


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data:`` payloads of a server-sent event stream (``[DONE]`` included, last)."""
    for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments, event:/id: fields
        data = line[5:].strip()
        if data:
            yield data
        if data == "[DONE]":
            return


def parse_chunk(chunk: object, endpoint: str = "chat") -> tuple[str, str, dict | None]:
    """(text delta, finish reason or "", usage or None) of one streamed event."""
    if not isinstance(chunk, dict):
        raise ValueError(f"event is not a JSON object: {snippet(json.dumps(chunk))}")
    if "error" in chunk and not chunk.get("choices"):
        raise ValueError(f"server sent an error event: {error_message(json.dumps(chunk))}")
    choices = chunk.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ValueError(f"event choices are not objects: {snippet(json.dumps(chunk))}")
    text = finish = ""
    if choices:
        text = _choice_text(choices[0], endpoint, delta=True)
        finish = choices[0].get("finish_reason") or ""
    return text, finish, chunk.get("usage") or None


def usage_problem(usage: object) -> str | None:
    """What makes a reported usage unusable (a count that is not a whole number >= 0: a server
    answered ``"prompt_tokens": -1000``), or None (none reported is no problem)."""
    if not usage:
        return None
    if not isinstance(usage, dict):
        return f"usage is not an object: {snippet(json.dumps(usage))}"
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        return f"prompt_tokens_details is not an object: {snippet(json.dumps(details))}"
    for name, value in (
        ("prompt_tokens", usage.get("prompt_tokens")),
        ("completion_tokens", usage.get("completion_tokens")),
        ("prompt_tokens_details.cached_tokens", details.get("cached_tokens")),
        ("prompt_cache_hit_tokens", usage.get("prompt_cache_hit_tokens")),
    ):
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value >= 0 and value == int(value)):
            return f"{name} {json.dumps(value)} is not a token count"
    return None


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """(prompt, completion, cached prompt) tokens, or None when the server reported no usage or
    an unusable one (``usage_problem``)."""
    if not usage or usage_problem(usage) or usage.get("prompt_tokens") is None:
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None:
        cached = usage.get("prompt_cache_hit_tokens", 0)  # DeepSeek's name for the same thing
    return int(usage["prompt_tokens"]), int(usage.get("completion_tokens") or 0), int(cached or 0)


def error_message(body: str, limit: int = 500) -> str:
    """The server's message from an error body (OpenAI ``error.message``, FastAPI ``detail``)."""
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        return body.strip()[:limit]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return str(err)[:limit]
    return body.strip()[:limit]


def apply_stop(text: str, stop: Iterable[str]) -> str:
    """Cut at the first stop string (servers usually do; this makes it true for all)."""
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=-1)
    return text if cut < 0 else text[:cut]


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
