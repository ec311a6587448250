"""A pipeline behind an HTTP endpoint: ``POST url`` with ``{"question", "id", "corpus"}``, a JSON
answer back (the fields of ``PipelineAnswer``).

The transport is the OpenAI-compatible backend's (``ragbench.llm.openai.http``): httpx, the same
retry policy (408/409/425/429, 5xx, timeouts and dropped connections, with backoff honouring
``Retry-After``, ``retries`` times), the same errors naming the redacted URL, the attempts and
the server's message, and httpx's logs redacted. Header values come from environment variables
named in ``headers_env`` and are remembered as secrets, so no message or file can quote them. A
URL's ``user:password@`` is sent as HTTP Basic auth, unless ``headers_env`` sets
``Authorization``: then that header is sent, the userinfo is dropped and a warning says so (as
the OpenAI backend does).

``check(params)`` is the preflight: one ``GET url`` (5 s) before any work (and one of
``setup_url``). Any answer but 401, 403 or 404 means the service is up (a POST-only route
answers 405 or 501); a refused connection, no answer, or those statuses raise
``ServerUnreachable`` naming the URL and the cause.

``post_setup`` is the corpus setup hook over HTTP: ``POST setup_url`` with ``{"corpus": id,
"documents": [{"id", "text", "title", "meta"}]}`` and the same headers and retries; any 2xx
answer (a body or none) means the corpus is indexed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ragbench import secrets
from ragbench.llm.base import ServerUnreachable
from ragbench.llm.openai import http
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.types import Document

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)
CHECK_TIMEOUT = 5.0
BACKOFF_BASE, BACKOFF_MAX = 0.5, 30.0
_clients: dict[tuple, httpx.Client] = {}
_lock = threading.Lock()


def headers_of(params: PipelineParams) -> dict[str, str]:
    """{header: value} from the environment; a variable that is not set is an error."""
    out = {}
    for header, env in params.headers.items():
        value = os.environ.get(env)
        if value is None:
            raise ValueError(
                f"pipeline {params.url}: header {header!r} reads ${env}, which is not set"
            )
        secrets.remember(value)
        out[header] = value
    return out


def sends_url_userinfo(params: PipelineParams) -> bool:
    """Whether the URL's ``user:password@`` is sent (as HTTP Basic auth): not when
    ``headers_env`` sets ``Authorization``, which httpx's Basic auth would silently replace; the
    header is sent and the userinfo dropped, with a warning (as the OpenAI backend does)."""
    return not any(h.lower() == "authorization" for h in params.headers)


def request_url(params: PipelineParams, raw: str) -> str:
    """``raw`` as requested: without its userinfo when it is not to be sent."""
    if sends_url_userinfo(params):
        return raw
    parts = urlsplit(raw)
    if "@" not in parts.netloc:
        return raw
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def client(params: PipelineParams) -> httpx.Client:
    """One httpx client per endpoint, headers and timeout (connections are reused)."""
    import httpx  # lazy: only url pipelines need it

    headers = headers_of(params)
    key = (params.raw_url, tuple(sorted(headers.items())), params.timeout)
    with _lock:
        if key not in _clients:
            if not sends_url_userinfo(params) and any(
                "@" in urlsplit(u).netloc for u in (params.raw_url, params.raw_setup_url) if u
            ):
                log.warning(
                    "pipeline %s carries user:password but headers_env sets Authorization: "
                    "sending that only",
                    params.url,
                )
            http.redact_httpx_logs()
            timeout = httpx.Timeout(params.timeout, connect=min(10.0, params.timeout))
            _clients[key] = httpx.Client(headers=headers, timeout=timeout)
        return _clients[key]


def policy(params: PipelineParams) -> http.RetryPolicy:
    """The endpoint's retry policy: its ``timeout`` per connect and read, ``retries``, and no
    deadline beyond them (a pipeline may take long to answer; its own timeout says how long)."""
    return http.RetryPolicy(
        timeout=params.timeout,
        connect_timeout=min(10.0, params.timeout),
        max_retries=params.retries,
        backoff_base=BACKOFF_BASE,
        backoff_max=BACKOFF_MAX,
        deadline=None,
    )


def _attempt(c: httpx.Client, url: str, payload: dict[str, object], budget: http.Budget) -> object:
    resp = c.post(url, json=payload, timeout=budget.timeouts())
    if resp.status_code >= 400:
        raise http.status_error(resp, resp.text)
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"the endpoint answered HTTP {resp.status_code} with no JSON ({exc}): "
            f"{secrets.redact_text(resp.text[:200])!r}"
        ) from None


def post(params: PipelineParams, question: str, example_id: str, corpus: str | None) -> object:
    """The endpoint's JSON answer to one question (after retries), or ``LLMRequestError``."""
    payload = {"question": question, "id": example_id, "corpus": corpus}
    return _post(params, params.raw_url, params.url, payload, _attempt)


def _attempt_setup(
    c: httpx.Client, url: str, payload: dict[str, object], budget: http.Budget
) -> None:
    resp = c.post(url, json=payload, timeout=budget.timeouts())
    if resp.status_code >= 400:
        raise http.status_error(resp, resp.text)


def post_setup(params: PipelineParams, corpus: str, documents: list[Document]) -> None:
    """Hand the corpus (``Document``s) to ``setup_url`` (after retries), or ``LLMRequestError``."""
    payload = {"corpus": corpus, "documents": [d.to_dict() for d in documents]}
    _post(params, params.raw_setup_url, params.setup_url, payload, _attempt_setup)


def _post(
    params: PipelineParams,
    raw_url: Any,
    shown_url: Any,
    payload: dict,
    attempt: Callable[..., object],
) -> object:
    """``attempt`` at POSTing ``payload`` to ``raw_url`` (``shown_url`` in messages), with the
    pipeline's retries: what the successful attempt returned."""
    result, _ = http.with_retries(
        attempt,
        client(params),
        request_url(params, raw_url),
        payload,
        url=shown_url,
        policy=policy(params),
        sleep=time.sleep,
    )
    return result


def check(params: PipelineParams, timeout: float = CHECK_TIMEOUT) -> None:
    """The preflight (see the module docstring); ``ServerUnreachable`` when it fails."""
    _check(params, params.raw_url, params.url, timeout)
    if params.setup_url is not None:
        _check(params, params.raw_setup_url, params.setup_url, timeout)


def _check(params: PipelineParams, raw_url: Any, shown_url: Any, timeout: float) -> None:
    import httpx  # lazy: only url pipelines need it

    try:
        resp = client(params).get(request_url(params, raw_url), timeout=httpx.Timeout(timeout))
    except httpx.TimeoutException as exc:
        phase = "connect" if isinstance(exc, httpx.ConnectTimeout) else "answer"
        cause = f"no {phase} within {timeout:g} s ({type(exc).__name__})"
    except httpx.ConnectError as exc:
        cause = f"cannot connect ({exc}); is the service running and the url right?"
    except httpx.TransportError as exc:
        cause = f"{type(exc).__name__}: {exc}"
    else:
        if resp.status_code not in (401, 403, 404):
            return
        cause = f"HTTP {resp.status_code}"
        if resp.status_code == 404:
            cause += ": no such route (check the url's path)"
        else:
            cause += ": the service refused our headers (check headers_env and its variables)"
    msg = f"pipeline endpoint check failed: GET {shown_url}: {cause}; nothing was run"
    raise ServerUnreachable(secrets.redact_text(" ".join(msg.split()))) from None
