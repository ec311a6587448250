"""The OpenAI-compatible backend's preflight (``OpenAICompatLLM.check``): before a run, the
server is asked what the run will ask, so a server that cannot serve it stops the run in seconds,
in its own words, instead of failing every record after their retries.

Two requests, no retries:

- ``GET <base>/models`` (``get_models``): a refused connection, no answer, refused credentials or
  another HTTP error raise ``ServerUnreachable`` naming the URL and why. A server without a
  /models route (404, 405, 501: the route is optional) answered, so it is up: that passes;
- one completion of one token (``send_probe``): ``probe_request``, built into a payload by the
  run's own ``build_payload`` (the same keys as an answer call: model, messages or prompt,
  max_tokens, temperature, stop, and stream with stream_options when streaming), sent by the
  run's client with the run's headers (credentials, the configured ones, an ``X-Request-ID``)
  through the run's ``post_completion``. A refusal raises ``ServerRefused`` with the server's
  reply; one that gives no reason (a 4xx with an empty body) names what the request carried
  (method, path, header names, payload keys; ``payload.describe_request``). A 429 passes: the
  server is up and the run's requests wait as it asks.

What it does not check: that the answers are right (a model behind the wrong chat template
answers, badly; ``analysis.summary.empty_answer_notes`` says so after the run).
"""

from __future__ import annotations

import logging
from typing import Any

from ragbench import secrets
from ragbench.llm.base import ServerUnreachable
from ragbench.llm.openai import http
from ragbench.llm.openai import payload as wire
from ragbench.types import GenerationRequest

log = logging.getLogger(__name__)

# GET /models answers in milliseconds on a live server; this bounds its connect and its read
# each, and the probe's connect, so a dead or black-holed host is reported in seconds
CHECK_TIMEOUT = 5.0
# Statuses of a server that is up but has no /models (it is optional in OpenAI-compatible servers)
NO_MODELS_ROUTE = frozenset({404, 405, 501})
# the probe's prompt and stop strings: a short prompt shaped as ragbench's answer calls, whose
# stop is a blank line (``strategies.prompts.ANSWER_STOP``; the llm layer cannot import it)
PROBE_PROMPT = "Reply with one word: ready."
PROBE_STOP = ("\n\n",)


class ServerRefused(ServerUnreachable):
    """The server answered the preflight's one-token completion with a refusal or an unreadable
    answer: the run's requests, built and sent the same way, would get the same."""


def probe_request() -> GenerationRequest:
    """The preflight's completion: one token, greedy, with an answer call's stop strings."""
    return GenerationRequest(prompt=PROBE_PROMPT, max_new_tokens=1, stop=PROBE_STOP)


def credentials_hint(status: int) -> str:
    """What to check when a server refuses our credentials (401, 403); else nothing."""
    if status not in (401, 403):
        return ""
    # (no "credentials: ..." here: redact_text would take the words after it for one)
    return (
        f"; the server refused our credentials (check the API key in "
        f"{' or '.join(wire.KEY_ENV)} or api_key, the user:password in base_url, "
        "and any auth headers)"
    )


def _no_answer(exc: Exception, timeout: Any) -> str | None:
    """Why a request got no answer (a timeout, a refused or dropped connection), or None."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        connect = isinstance(exc, httpx.ConnectTimeout)
        seconds = (timeout.connect if connect else timeout.read) if timeout is not None else None
        within = f" within {seconds:g} s" if seconds is not None else ""
        return f"no {'connect' if connect else 'answer'}{within} ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc}); is the server running and base_url right?"
    if isinstance(exc, httpx.TransportError):
        return f"{type(exc).__name__}: {exc}"
    return None


def _fail(kind: type[ServerUnreachable], what: str, cause: str) -> ServerUnreachable:
    msg = f"OpenAI-compatible server check failed: {what}: {cause}"
    return kind(secrets.redact_text(" ".join(msg.split())))


def get_models(client: Any, url: str, shown: str, timeout: float) -> None:
    """``GET url`` (the /models route; ``shown``: its redacted form for messages), ``timeout``
    seconds to connect and as many to read, no retries; ``ServerUnreachable`` when it fails."""
    import httpx

    limit = httpx.Timeout(timeout)
    try:
        resp = client.get(url, timeout=limit)
    except httpx.TransportError as exc:
        raise _fail(ServerUnreachable, f"GET {shown}", _no_answer(exc, limit) or str(exc)) from None
    status = resp.status_code
    if status < 400 or status in NO_MODELS_ROUTE:
        return
    cause = f"HTTP {status}: {wire.error_message(resp.text, limit=200)}{credentials_hint(status)}"
    raise _fail(ServerUnreachable, f"GET {shown}", cause)


def send_probe(
    client: object,
    url: str,
    shown: str,
    payload: dict[str, object],
    endpoint: str,
    *,
    timeout: object,
    connections: http.Connections | None = None,
) -> None:
    """``POST url`` with ``payload`` (the probe, as ``probe_request`` built by the run's
    ``build_payload``) the way a run's attempt is sent, once (``timeout``: an ``httpx.Timeout``).
    ``ServerRefused`` with the server's reply when it refuses or answers unreadably,
    ``ServerUnreachable`` when it does not answer; a 429 passes (the server is up)."""
    what = f"POST {shown} (one {payload.get('max_tokens', 1)}-token completion sent as the run's)"
    try:
        http.post_completion(
            client, url, payload, endpoint, timeout=timeout, connections=connections
        )
        return
    except http.StatusError as exc:
        if exc.status == 429:
            log.info("%s: rate limited (HTTP 429); the run's requests wait as it asks", shown)
            return
        cause = f"HTTP {exc.status}: {exc.message}{credentials_hint(exc.status)}"
        raise _fail(ServerRefused, what, f"{cause}. Nothing was run") from None
    except (http.BadResponse, http.IncompleteStream) as exc:
        request = f" (request {exc.request_id})" if exc.request_id else ""
        cause = f"an answer that cannot be read{request}: {exc}. Nothing was run"
        raise _fail(ServerRefused, what, cause) from None
    except Exception as exc:
        unreachable = _no_answer(exc, timeout)
        if unreachable is None:
            raise
        raise _fail(ServerUnreachable, what, unreachable) from None
