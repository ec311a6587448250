"""OpenAI-compatible HTTP backend: vLLM, SGLang, TGI, `transformers serve` and hosted APIs.

``OpenAICompatLLM``: configuration, credentials and the HTTP client, the server check, batches
on a thread pool, and each ``Completion`` with its token counts and timings. One job: the
backend, a batch of requests in and their completions out with what each cost. Payload building
and response parsing are pure functions in ``openai/payload.py`` (``wire``); one request's POST,
event-stream reading, retries and errors are in ``openai/http.py`` (``http``); the server check
in ``openai/preflight.py``. What it does:

- chat (``/v1/chat/completions``) or completions (``/v1/completions``) endpoint;
- base URL, model and key from arguments or the environment (``OPENAI_BASE_URL``,
  ``RAGBENCH_API_KEY`` or ``OPENAI_API_KEY``, ``OPENAI_MODEL``);
- credentials: the key, extra ``headers``, and what the base URL carries (``user:password@``, a
  ``?token=``) live only inside the HTTP client. ``identity()``, ``repr``, completions, logs and
  exception messages show the URL through ``secrets.redact_url`` (no userinfo, secret query
  values masked), and every secret is ``secrets.remember``-ed so error text quoting it is masked.
  The request URL never carries userinfo: with a key the server gets ``Authorization: Bearer
  <key>`` only; without one, the URL's ``user:password`` is sent as HTTP Basic auth. A
  ``headers`` entry named ``Authorization`` replaces both. The query is kept on every request
  (Azure needs ``api-version``);
- a batch runs on a thread pool of ``max_concurrency`` workers sharing one ``httpx.Client`` with
  as many connections, all kept alive between batches, so ``max_concurrency`` C against a server
  that answers in L seconds sustains about C/L requests per second (``benchmarks/http_bench.py``);
- rate limits (``rate_limit``: requests and tokens per minute, ``ragbench.llm.rate_limit``): one
  limiter shared by every thread waits before each attempt as the configured limits and the
  server's ``x-ratelimit-*`` headers require; a 429 pauses every thread, not only its own, for
  its ``Retry-After`` (or the reset) capped at ``backoff_max``, as each retry's wait is;
- each request retries with exponential backoff (tenacity) on 408/409/425/429/5xx, timeouts and
  dropped connections, honouring ``Retry-After`` (the waits go through ``sleep``, which tests
  replace), under one ``http.RetryPolicy``: ``connect_timeout`` (5 s) and ``timeout`` (25 s, the
  longest silence while reading) apart, ``max_retries`` (4), and a ``deadline`` on the request in
  all (55 s, or one whole attempt when the timeouts are longer; a rate limit's waits not
  counted), so a dead server fails a request in under a minute, each retry logged in one line;
  then a ``LLMRequestError`` names the URL, the attempts, the HTTP status and the server's last
  message. A failed request never yields a partial ``Completion``. These settings change when a
  request gives up, never what an answer means: the config hash leaves them out. Every request
  of a batch runs to its own end, so a failed batch raises ``LLMBatchError`` with the finished
  completions in ``.partial`` (the cache stores them) and each failed request's own error in
  ``.errors``: the caller never needs to resend a request, which would repeat its retries;
- an interrupted batch (Ctrl-C's ``KeyboardInterrupt``, or the ``SystemExit`` a SIGTERM handler
  raises, arriving in the calling thread) sends nothing more: the queued requests are cancelled,
  no worker starts another attempt or sits out a backoff or rate-limit wait (those waits end at
  once when ``sleep`` is the default), the requests in flight (sent, so maybe paid for) get
  ``IN_FLIGHT_GRACE_SECONDS`` to finish and are then cut (``http.Connections``: their sockets
  shut down, so the server sees the client go and the workers end at once), and the exception
  leaves, within about two seconds, with the finished completions in ``.partial``, which the
  completion cache stores: a rerun does not pay for them again;
- ``check()``: the preflight (``openai/preflight.py``): ``GET <base>/models`` and one one-token
  completion sent as the run's requests are (payload shape, headers), no retries, raising
  ``ServerUnreachable`` (``ServerRefused`` with the server's reply) before a run rather than one
  error row per record;
- latency: with ``stream=True`` (default) the server-sent events give time to first token
  (``prefill_seconds``, which includes queueing and network) and the rest is ``decode_seconds``.
  Without streaming (or from a server that answers a streaming request with one JSON body) only
  the total is known: it goes to ``decode_seconds`` and ``meta["ttft_measured"]`` is False;
- a stream cut short (mid-event or before its finish reason) is retried like a dropped
  connection; a body that is not a readable completion fails at once, its error naming the URL
  and the request id (``X-Request-ID``, sent with each attempt, or the server's own);
- usage from the response, cached prompt tokens from ``prompt_tokens_details.cached_tokens``;
  when a server reports none, or an unusable one (a negative or non-numeric count: it would
  price the record at nonsense), tokens are counted locally and ``usage_estimated`` is True (the
  rejected usage is named in ``meta["usage_rejected"]`` and logged once per backend). What is
  counted is what was sent (``prompt_tokens``): the payload's messages through the tokenizer's
  chat template where it has one (as the server's ``apply_chat_template`` renders them), else
  the payload's text;
- ``resource_seconds``: its share of the time the server was busy with this backend's requests,
  split among those in flight by token work (``server_time.py``); the shares add up to the busy
  wall time, not to the requests' own times, which count the device once per concurrent request.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from ragbench import secrets
from ragbench.llm.base import LLM, tell_batch
from ragbench.llm.kv.variants import refuse_variants
from ragbench.llm.openai import http, preflight
from ragbench.llm.openai import payload as wire
from ragbench.llm.openai.http import LLMBatchError
from ragbench.llm.rate_limit import RateLimiter
from ragbench.llm.server_time import RESOURCE_SECONDS_BASIS, BusyTimeline, token_work
from ragbench.tokenizers import Tokenizer, get_tokenizer
from ragbench.types import Completion, GenerationRequest

log = logging.getLogger(__name__)

# after an interrupt, how long the requests in flight may take to finish before they are cut,
# and how long the cut ones are then given to end: one Ctrl-C is answered within two seconds
IN_FLIGHT_GRACE_SECONDS = 1.0
CUT_WAIT_SECONDS = 0.5


# what a URL's user:password gave way to, already said once in this process: a run builds the
# backend twice (the preflight counts prompts with one), and once is enough
_WARNED_USERINFO: set[tuple[str, str]] = set()
_WARNED_LOCK = threading.Lock()


class Interrupted(Exception):
    """A request not (re)sent because its batch was interrupted (not retried)."""


# ---------------------------------------------------------------------------- the backend


class OpenAICompatLLM(LLM):
    """An OpenAI-compatible server. ``tokenizer`` (a preset name or folder for
    ``ragbench.tokenizers.get_tokenizer``) counts tokens for the window check and when a server
    reports no usage; without it a rough 4-characters-per-token estimate is used."""

    capabilities = LLM.capabilities  # a server: its weights, KV and positions are its own

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,  # may carry user:password@ and a query (see the module doc)
        api_key: str | None = None,
        *,  # the rest by name (a config's model.params)
        endpoint: str = "chat",
        context_window: int = 8192,
        tokenizer: str | None = None,
        max_concurrency: int = 8,
        # the retry policy (``http.RetryPolicy``; transport only, not in the config hash): the
        # longest silence while reading (per event when streaming), the connect, retries of a
        # retryable failure, their waits, and the request's deadline in all (None: 55 s, or one
        # whole attempt when the timeouts are longer)
        timeout: float = http.READ_TIMEOUT,
        connect_timeout: float = http.CONNECT_TIMEOUT,
        max_retries: int = http.MAX_RETRIES,
        backoff_base: float = http.BACKOFF_BASE,
        backoff_max: float = http.BACKOFF_MAX,
        deadline: float | None = None,
        stream: bool = True,
        revision: str = "",  # weights revision/hash, for cache keys (the server can't tell us)
        # Sent with every request (an organisation id, a gateway's auth header). Values are treated
        # as secrets; they are not in identity(): a header selects who pays or may call, not what
        # the model answers (what changes answers belongs in ``revision``), and a rotated token
        # must not invalidate the completion cache.
        headers: Mapping[str, str] | None = None,
        # waits between retries and for rate limits; tests pass a no-op. None: ``time.sleep``,
        # except that an interrupted batch ends the wait at once
        sleep: Callable[[float], None] | None = None,
        # {requests_per_minute, tokens_per_minute} (``model.rate_limit``), or a RateLimiter to
        # share with another backend on the same account; None: only the server's headers limit
        rate_limit: RateLimiter | Mapping[str, Any] | None = None,
    ) -> None:
        model = model or os.environ.get("OPENAI_MODEL")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        # stored with its credentials masked (compare.yaml): the full URL from OPENAI_BASE_URL
        base_url = secrets.fill_masked_url(base_url, "OPENAI_BASE_URL", "model.params.base_url")
        if not model:
            raise ValueError("OpenAICompatLLM needs a model: pass model= or set OPENAI_MODEL")
        if not base_url:
            raise ValueError(
                "OpenAICompatLLM needs a server: pass base_url= (e.g. http://127.0.0.1:8000/v1) "
                "or set OPENAI_BASE_URL"
            )
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        self.policy = http.RetryPolicy.of(
            timeout,
            connect_timeout,
            deadline,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
        )
        if api_key is not None and not isinstance(api_key, str):  # else sent as "Bearer <repr>"
            raise ValueError(
                f"api_key must be a string, not {type(api_key).__name__} (its value is not shown)"
            )
        headers = wire.check_headers(headers)
        key = api_key or next((os.environ[k] for k in wire.KEY_ENV if os.environ.get(k)), None)
        creds = wire.url_credentials(base_url)
        # Remember every secret first, so that no message from here on (even a ValueError about
        # this very URL) can quote one.
        secrets.remember(key, creds.password, *secrets.header_secrets(headers))
        secrets.remember(*(v for k, v in creds.query if secrets.is_secret_name(k)))
        secrets.collect(base_url)  # the percent-encoded forms as written

        # Where requests go: no userinfo (it would become Basic auth behind our back) and no
        # query (the client adds it to every request, so it lives only inside the client).
        self._post_url = wire.endpoint_url(base_url, endpoint)  # validates endpoint and URL
        self._models_url = wire.api_root(base_url) + "/models"
        self._models_shown = secrets.redact_url(wire.with_query(self._models_url, creds.query))
        # What people and caches see: the same URLs with the query, secret values masked.
        self.url = secrets.redact_url(wire.with_query(self._post_url, creds.query))
        self.base_url = secrets.redact_url(wire.with_query(wire.api_root(base_url), creds.query))
        self.name, self.model, self.endpoint = model, model, endpoint
        self.context_window, self.max_concurrency = context_window, max_concurrency
        self.stream, self.revision, self.tokenizer_name = stream, revision, tokenizer
        self.header_names = sorted(headers)
        self._stop = threading.Event()  # set when a batch is interrupted: no more attempts
        self.connections = http.Connections()  # so an interrupt can cut the requests in flight
        self.sleep = sleep if sleep is not None else self._wait
        # its waits are retry-like: the server's word pauses no longer than a retry waits
        self.limiter = RateLimiter.of(rate_limit, sleep=self.sleep, max_pause=backoff_max)
        self._tokenizer: Tokenizer | None = None
        self._has_key = bool(key)
        self._usage_warned = False  # a server's unusable usage is logged once
        self._client = self._make_client(key, creds, headers)
        self._lock = threading.Lock()
        # every request of this instance, across calls: their busy time is what they are charged
        self.timeline = BusyTimeline()

    def _make_client(self, key: str | None, creds: wire.Credentials, headers: dict[str, str]):
        # The secrets go straight into the client (httpx shows auth headers as [secure]); none is
        # an attribute of ours, so vars() and repr cannot show them.
        import httpx

        auth_header = {"Authorization": f"Bearer {key}"} if key else {}
        explicit_auth = any(h.lower() == "authorization" for h in headers)
        auth = None
        if creds.username is not None or creds.password is not None:
            if key or explicit_auth:
                what = "an Authorization header" if explicit_auth else "an API key"
                with _WARNED_LOCK:
                    first = (self.base_url, what) not in _WARNED_USERINFO
                    _WARNED_USERINFO.add((self.base_url, what))
                if first:
                    log.warning(
                        "%s carries user:password but %s is configured: sending that only",
                        self.base_url,
                        what,
                    )
            else:
                auth = httpx.BasicAuth(creds.username or "", creds.password or "")
        if explicit_auth:
            auth_header = {}
        http.redact_httpx_logs()
        c = self.max_concurrency  # every worker keeps its connection between batches
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        return httpx.Client(
            headers={**auth_header, **headers},
            auth=auth,
            params=list(creds.query),
            timeout=httpx.Timeout(self.policy.timeout, connect=self.policy.connect_timeout),
            limits=limits,
        )

    def __repr__(self) -> str:
        key = "'***'" if self._has_key else "None"
        extra = f", headers={self.header_names!r}" if self.header_names else ""
        return f"OpenAICompatLLM(model={self.model!r}, url={self.url!r}, api_key={key}{extra})"

    def identity(self) -> dict[str, Any]:
        # ``url``, not the host: two servers behind one host:port (a gateway's /a/v1 and /b/v1)
        # are different models. Redacted and without userinfo, so a new password or token keeps
        # the cache; non-secret query values (api-version) stay, they can change the answers.
        return {
            "backend": "openai",
            "url": self.url,
            "model": self.model,
            "endpoint": self.endpoint,
            "revision": self.revision,
        }

    def check(self, timeout: float = preflight.CHECK_TIMEOUT) -> None:
        """The preflight (``openai/preflight.py``): ``GET <base>/models`` (``timeout`` seconds to
        connect and as many to read), then one one-token completion sent as the run's requests
        are (its connect within ``timeout``, its read within the run's ``timeout``); no retries.
        ``ServerUnreachable`` (``ServerRefused`` for a refusal) names the URL and why, with the
        server's reply."""
        import httpx

        preflight.get_models(self._client, self._models_url, self._models_shown, timeout)
        payload = wire.build_payload(
            preflight.probe_request(), self.model, self.endpoint, self.stream
        )
        policy = self.policy
        limit = httpx.Timeout(policy.timeout, connect=min(timeout, policy.connect_timeout))
        preflight.send_probe(
            self._client,
            self._post_url,
            self.url,
            payload,
            self.endpoint,
            timeout=limit,
            connections=self.connections,
        )

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ token counting

    def _counter(self) -> Tokenizer:
        if self._tokenizer is None:
            with self._lock:
                self._tokenizer = self._tokenizer or get_tokenizer(self.tokenizer_name)
        return self._tokenizer

    def count_tokens(self, text: str) -> int:
        if self.tokenizer_name is None:
            return math.ceil(len(text) / 4)
        return self._counter().count(text)

    def prompt_tokens(self, request: GenerationRequest) -> int:
        """Tokens of what ``request`` sends: its payload's messages rendered by the tokenizer's
        chat template where it has one (what the server's ``apply_chat_template`` gives:
        role markers, the generation prompt), else the payload's text as it is."""
        payload = wire.build_payload(request, self.model, self.endpoint)
        text = wire.payload_text(payload)
        if self.tokenizer_name is None:
            return math.ceil(len(text) / 4)
        tokenizer = self._counter()
        hf = getattr(tokenizer, "hf", None)  # a transformers tokenizer (not whitespace)
        if "messages" in payload and hf is not None and getattr(hf, "chat_template", None):
            text = hf.apply_chat_template(
                payload["messages"], tokenize=False, add_generation_prompt=True
            )  # its special tokens are in the text: counted without adding more
        return tokenizer.count(text)

    # ------------------------------------------------------------------ generation

    def _wait(self, seconds: float) -> None:
        """The default ``sleep``: ``seconds``, or less when the batch is interrupted."""
        if self._stop.wait(max(0.0, seconds)):
            raise Interrupted("the batch was interrupted")

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        # a server keeps its KV cache its own way (vLLM: --kv-cache-dtype); a request cannot
        refuse_variants(requests, "OpenAI-compatible")
        self._stop.clear()  # an earlier call's interrupt does not stop this one
        # Every request runs to its own end (a completion, or an error after its own retries),
        # even when another has failed: the caller then knows each request's fate and never
        # has to resend one, which would repeat its retries against the server.
        finished: dict[int, tuple[Completion, int]] = {}  # index -> (completion, its ticket)
        errors: dict[int, BaseException] = {}  # a worker's future may hold any exception
        if len(requests) == 1:
            try:
                finished[0] = self._request(requests[0], time.perf_counter())
            except Exception as exc:
                if not hasattr(exc, "partial"):  # nothing else finished; not to be resent
                    tell_batch(exc, partial={})
                raise
        else:
            pool = ThreadPoolExecutor(min(self.max_concurrency, len(requests)))
            # each request's clock starts at submission: the wait for a free worker (the local
            # concurrency limit) is queue time, not the server's time to first token
            futures = [pool.submit(self._request, r, time.perf_counter()) for r in requests]
            try:
                for i, f in enumerate(futures):
                    error = f.exception()
                    if error is None:
                        finished[i] = f.result()
                    else:
                        errors[i] = error
            except BaseException as stop:  # Ctrl-C, or SIGTERM's SystemExit, in this thread
                tell_batch(stop, partial=self.timeline.charge(self._stop_batch(pool, futures)))
                raise
            pool.shutdown()
        results = self.timeline.charge(finished)  # a failed batch's finished ones too
        if errors:
            raise LLMBatchError(results, errors, len(requests))
        return [results[i] for i in range(len(requests))]

    def _stop_batch(
        self, pool: ThreadPoolExecutor, futures: list[Future]
    ) -> dict[int, tuple[Completion, int]]:
        """An interrupted batch: nothing more is sent (the queued requests are cancelled, no
        worker starts another attempt or goes on waiting); the requests in flight get
        ``IN_FLIGHT_GRACE_SECONDS`` to finish, then their connections are cut and their workers
        end (a second interrupt cuts them at once); the finished ones. A request cut is not
        waited out: a hung server would hold the interrupt for a whole read timeout."""
        self._stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        # (a future cancelled in the queue never counts as done for ``wait``)
        sent = [f for f in futures if not f.cancelled()]
        try:
            late = wait(sent, IN_FLIGHT_GRACE_SECONDS).not_done
        except BaseException:  # a second interrupt: no grace
            late = {f for f in sent if not f.done()}
        if late:
            log.warning(
                "interrupted: cutting the %d request(s) to %s still in flight after %g s",
                len(late),
                self.url,
                IN_FLIGHT_GRACE_SECONDS,
            )
            self.connections.cut()
            with contextlib.suppress(BaseException):
                wait(late, CUT_WAIT_SECONDS)  # their reads fail at once; the workers end
        return {
            i: f.result()
            for i, f in enumerate(futures)
            if f.done() and not f.cancelled() and f.exception() is None
        }

    def _request(self, request: GenerationRequest, submitted: float) -> tuple[Completion, int]:
        """One request to its end: its completion (resource seconds to come) and its answering
        attempt's timeline ticket. ``queue_seconds`` is everything its user waited that was not
        the answering attempt: a free worker, and earlier failed attempts with their backoff."""
        payload = wire.build_payload(request, self.model, self.endpoint, self.stream)
        # what a TPM limit counts before the answer: the prompt and max_tokens (OpenAI's rule)
        tokens = (
            self.prompt_tokens(request) + request.max_new_tokens
            if self.limiter.tokens_per_minute
            else 0
        )
        (parsed, prefill, decode, sent, end), attempts = self._with_retries(
            self._attempt, payload, tokens
        )
        queue = max(0.0, time.perf_counter() - submitted - prefill - decode)
        with self.timeline.sending(sent):  # left out of the timeline if this fails
            c = self._completion(request, parsed, (prefill, decode, queue), attempts)
            self.timeline.finish(sent, end, token_work(c))
        return c, sent

    def _attempt(
        self, payload: dict[str, Any], tokens: int, budget: http.Budget
    ) -> tuple[wire.Parsed, float, float, int, float]:
        """One attempt, admitted by the rate limiter (its wait is queue time, before the clock of
        ``post_completion`` starts, and not counted against ``budget``'s deadline), which then
        sees the answer's status and headers: (parsed, prefill s, decode s, its timeline ticket:
        sent after the limiter, its last byte's time)."""
        lim = self.limiter
        if self._stop.is_set():
            raise Interrupted("the batch was interrupted")
        with budget.excuse():
            ticket = lim.acquire(tokens)
        if self._stop.is_set():  # interrupted while the limiter waited
            raise Interrupted("the batch was interrupted")

        def seen(status: int, headers: Any) -> None:
            lim.observe(ticket, status, headers, wire.parse_retry_after(headers.get("retry-after")))

        with self.timeline.sending() as sent:  # a failed attempt is charged nothing
            out = http.post_completion(
                self._client,
                self._post_url,
                payload,
                self.endpoint,
                on_response=seen,
                timeout=budget.timeouts(),
                connections=self.connections,
            )
            end = self.timeline.clock()
            counts = wire.usage_counts(out[0].usage)
            lim.settle(ticket, counts[0] + counts[1] if counts else None)
        return (*out, sent, end)

    def post_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` to ``<api root>/<path>`` (e.g. ``embeddings``) with this client's
        credentials, headers and retry policy; the JSON reply. Other OpenAI endpoints (the
        server embedder) reuse the client instead of a second copy of the secrets and retries."""
        url = self._models_url.removesuffix("/models") + "/" + path.lstrip("/")
        self._stop.clear()  # an earlier call's interrupt does not stop this one

        def once(budget: http.Budget) -> dict[str, Any]:
            request_id = http.new_request_id()
            resp = self._client.post(
                url,
                json=payload,
                headers={http.REQUEST_ID_HEADER: request_id},
                timeout=budget.timeouts(),
                extensions=self.connections.extensions,
            )
            if resp.status_code >= 400:
                raise http.status_error(resp, resp.text, payload)
            try:
                return wire.parse_json(resp.text)
            except ValueError as exc:
                request_id = resp.headers.get("x-request-id") or request_id
                raise http.BadResponse(str(exc), request_id) from None

        return self._with_retries(once, url=secrets.redact_url(url))[0]

    def _with_retries(
        self, attempt: Callable[..., Any], *args: Any, url: str | None = None
    ) -> tuple[Any, int]:
        """``attempt(*args, budget)`` under this backend's retry policy: (its result, attempts
        made), or ``LLMRequestError`` naming ``url`` (redacted; default ``self.url``)."""
        policy, url = self.policy, url or self.url
        return http.with_retries(attempt, *args, policy=policy, url=url, sleep=self.sleep)

    def _completion(
        self,
        request: GenerationRequest,
        parsed: wire.Parsed,
        seconds: tuple[float, float, float],
        attempts: int,
    ) -> Completion:
        """The completion of ``parsed``, the answer to ``request``; ``seconds``: its prefill,
        decode and queue time."""
        prefill, decode, queue = seconds
        text = wire.apply_stop(parsed.text, request.stop)
        counts = wire.usage_counts(parsed.usage)
        estimated = counts is None
        if counts is None:
            counts = (self.prompt_tokens(request), self.count_tokens(parsed.text), 0)
        meta: dict[str, Any] = {
            "endpoint": self.endpoint,
            "attempts": attempts,
            "ttft_measured": parsed.streamed,  # False when a server ignored stream=True
            # a server's device time is not visible from here: its share of the server's busy
            # time (server_time.py) is an estimate
            "resource_seconds_estimated": True,
            "resource_seconds_basis": RESOURCE_SECONDS_BASIS,
        }
        if estimated:
            meta["token_counter"] = self.tokenizer_name or "chars/4"
        if problem := wire.usage_problem(parsed.usage):
            meta["usage_rejected"] = problem
            if not self._usage_warned:
                self._usage_warned = True
                log.warning(
                    "%s reported unusable token usage (%s): tokens are counted locally "
                    "(usage_estimated)",
                    self.url,
                    problem,
                )
        if text != parsed.text:
            meta["stop_applied_locally"] = True
        return Completion(
            text=text,
            prompt_tokens=counts[0],
            completion_tokens=counts[1],
            cached_prompt_tokens=counts[2],
            prefill_seconds=prefill,
            decode_seconds=decode,
            queue_seconds=queue,
            finish_reason=parsed.finish_reason,
            model=parsed.model or self.model,
            usage_estimated=estimated,
            meta=meta,
        )
