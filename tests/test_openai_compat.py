"""OpenAI-compatible backend: pure payload/response functions, fault handling against a small
scripted HTTP server, the key never leaking, and (slow) a real `transformers serve` on loopback."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from openai_server import (
    ask,
    client,
    cut_mid_event,
    drop,
    hang,
    ok,
    raw,
    send_json,
    sequence,
    serving,
    status,
    user_text,
)

from ragbench.llm import ServerUnreachable, load_llm
from ragbench.llm.cache import CachedLLM, request_key
from ragbench.llm.openai.compat import OpenAICompatLLM
from ragbench.llm.openai.http import LLMBatchError, LLMRequestError
from ragbench.llm.openai.payload import (
    KEY_ENV,
    apply_stop,
    backoff_seconds,
    build_payload,
    endpoint_url,
    error_message,
    iter_sse_data,
    parse_chunk,
    parse_response,
    parse_retry_after,
    safe_url,
    url_credentials,
    usage_counts,
    usage_problem,
    with_query,
)
from ragbench.types import GenerationRequest

SECRET = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"
# the X-Request-ID each attempt sends: a random UUID (llama-cpp-python's server refuses others)
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"

# ---------------------------------------------------------------------------- pure functions


def test_build_payload_chat_and_completions():
    r = GenerationRequest(prompt="doc\nQ?", system="Be brief.", max_new_tokens=7, stop=("\n",))
    chat = build_payload(r, "m", "chat")
    assert chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "doc\nQ?"},
        ],
        "max_tokens": 7,
        "temperature": 0.0,
        "stop": ["\n"],
    }
    assert "seed" not in chat  # greedy: nothing to seed
    # sampling: a seed from the request itself, the same every time, another for another request
    hot = GenerationRequest(prompt="doc\nQ?", system="Be brief.", temperature=0.7)
    seed = build_payload(hot, "m", "chat")["seed"]
    assert seed == build_payload(hot, "m", "chat")["seed"] and 0 <= seed < 2**31
    other = GenerationRequest(
        prompt="doc\nQ?", system="Be brief.\n(Independent judgement 2.)", temperature=0.7
    )
    assert build_payload(other, "m", "chat")["seed"] != seed
    comp = build_payload(GenerationRequest(prompt="The capital"), "m", "completions", stream=True)
    assert comp["prompt"] == "The capital" and "messages" not in comp and "stop" not in comp
    assert comp["stream"] is True and comp["stream_options"] == {"include_usage": True}
    with pytest.raises(ValueError, match="did you mean 'chat'"):
        build_payload(r, "m", "chats")


def test_parse_response_and_usage():
    body = {
        "model": "srv-model",
        "choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 30,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 16},
        },
    }
    p = parse_response(body, "chat")
    assert (p.text, p.finish_reason, p.model) == ("Paris", "stop", "srv-model")
    assert usage_counts(p.usage) == (30, 2, 16)
    legacy = parse_response(
        {"choices": [{"text": " Paris", "finish_reason": "length"}]}, "completions"
    )
    assert (legacy.text, legacy.usage) == (" Paris", None)
    assert usage_counts(None) is None
    assert usage_counts({"prompt_tokens": 5, "completion_tokens": 1}) == (5, 1, 0)
    assert usage_counts({"prompt_tokens": 5, "prompt_cache_hit_tokens": 4}) == (5, 0, 4)
    with pytest.raises(ValueError, match="no choices"):
        parse_response({"choices": []})
    with pytest.raises(ValueError, match="overloaded"):
        parse_response({"error": {"message": "overloaded"}})


def test_sse_parsing():
    lines = [
        ": keep-alive",
        'data: {"choices":[{"delta":{"role":"assistant"}}]}',
        "",
        'data: {"choices":[{"delta":{"content":"Pa"}}]}',
        'data: {"choices":[{"delta":{"content":"ris"},"finish_reason":"stop"}]}',
        'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}',
        "data: [DONE]",
        'data: {"never": "read"}',
    ]
    events = list(iter_sse_data(lines))
    assert events[-1] == "[DONE]" and len(events) == 5
    parsed = [parse_chunk(json.loads(e)) for e in events[:-1]]
    assert "".join(t for t, _, _ in parsed) == "Paris"
    assert [f for _, f, _ in parsed] == ["", "", "stop", ""]
    assert parsed[-1][2] == {"prompt_tokens": 9, "completion_tokens": 2}
    assert parse_chunk({"choices": [{"text": "x"}]}, "completions") == ("x", "", None)


def test_retry_after_backoff_and_error_messages():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert [backoff_seconds(a, 0.5, 3.0, None) for a in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    assert backoff_seconds(1, 0.5, 3.0, 2.0) == 2.0 and backoff_seconds(1, 0.5, 3.0, 60.0) == 3.0
    assert error_message('{"error": {"message": "rate limited"}}') == "rate limited"
    assert error_message('{"detail": "Not Found"}') == "Not Found"
    assert error_message("<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"
    assert apply_stop("42\nQuestion: next", ["\n", "Q"]) == "42"
    assert apply_stop("42", ["\n"]) == "42"


def test_urls():
    assert endpoint_url("http://h:8000", "chat") == "http://h:8000/v1/chat/completions"
    assert (
        endpoint_url("https://api.x.com/openai/v1/", "completions")
        == "https://api.x.com/openai/v1/completions"
    )
    assert safe_url("https://user:pw@h.com:8443/v1?key=abc") == "https://h.com:8443/v1"
    # userinfo never reaches the request URL (httpx would turn it into Basic auth on its own)
    assert endpoint_url("http://u:p@[::1]:8000/v1/?api-version=1", "chat") == (
        "http://[::1]:8000/v1/chat/completions"
    )
    creds = url_credentials("http://al%40ce:p%3Aw@h/v1?api-version=1&token=a%2Bb")
    assert (creds.username, creds.password) == ("al@ce", "p:w")
    assert creds.query == (("api-version", "1"), ("token", "a+b"))
    assert with_query("http://h/v1/models", creds.query) == (
        "http://h/v1/models?api-version=1&token=a%2Bb"
    )
    with pytest.raises(ValueError, match="http://host:port/v1"):
        endpoint_url("localhost:8000", "chat")


# ---------------------------------------------------------------------------- scripted server

serve = pytest.fixture(serving, name="serve")


def test_500_then_success_is_retried(serve):
    srv = serve(sequence(status(500, "internal"), status(503, "busy"), ok()))
    c = ask(client(srv))
    assert c.text == "echo hello world" and c.meta["attempts"] == 3
    assert (c.prompt_tokens, c.completion_tokens, c.cached_prompt_tokens) == (11, 3, 4)
    assert not c.usage_estimated and c.meta["ttft_measured"]
    assert srv.requests[0][0] == "/v1/chat/completions"


def test_429_honours_retry_after(serve):
    srv = serve(sequence(status(429, "slow down", {"Retry-After": "1"}), ok()))
    waits: list[float] = []
    c = ask(client(srv, backoff_base=0.01, backoff_max=5.0, sleep=waits.append))
    assert c.meta["attempts"] == 2
    assert waits == [1.0]  # waited the server's second, not 0.01 s


def test_retries_back_off_exponentially_up_to_the_cap(serve):
    srv = serve(sequence(status(500), status(502), status(503), ok()))
    waits: list[float] = []
    c = ask(client(srv, backoff_base=0.5, backoff_max=1.5, sleep=waits.append))
    assert c.meta["attempts"] == 4 and waits == [0.5, 1.0, 1.5]


def test_hang_past_timeout_gives_a_clear_error(serve):
    srv = serve(hang(3.0))
    t0 = time.perf_counter()
    with pytest.raises(LLMRequestError) as err:
        ask(client(srv, timeout=0.3, max_retries=1))
    assert time.perf_counter() - t0 < 2.9  # gave up before the 3 s hang ended
    msg = str(err.value)
    assert f"POST {srv.url}/chat/completions failed after 2 attempt(s)" in msg
    assert "timed out after 0.3 s" in msg and err.value.attempts == 2


def test_connection_drop_is_retried_then_fails(serve):
    srv = serve(sequence(drop(), ok(cut=True), ok()))  # no response, a cut stream, then fine
    c = ask(client(srv))
    assert c.text == "echo hello world" and c.meta["attempts"] == 3
    srv = serve(drop())
    with pytest.raises(LLMRequestError, match=r"failed after 3 attempt\(s\): connection failed"):
        ask(client(srv, max_retries=2))
    assert len(srv.requests) == 3


def test_client_errors_are_not_retried_and_name_the_server_message(serve):
    srv = serve(status(400, "maximum context length is 8192 tokens"))
    with pytest.raises(LLMRequestError, match="HTTP 400: maximum context length") as err:
        ask(client(srv))
    assert err.value.status == 400 and len(srv.requests) == 1


def test_streaming_measures_time_to_first_token(serve):
    srv = serve(ok(first_delay=0.3, between=0.1))
    c = ask(client(srv), prompt="a b")  # "echo a b": 3 events
    assert c.prefill_seconds >= 0.28 and 0.15 <= c.decode_seconds < 2.5
    c = ask(client(srv, stream=False))
    assert c.prefill_seconds == 0.0 and c.meta["ttft_measured"] is False
    assert c.decode_seconds > 0 and c.latency_seconds >= c.decode_seconds
    assert "stream" not in srv.requests[-1][2]


def test_missing_usage_is_estimated_with_the_tokenizer(serve):
    srv = serve(ok(usage=False))
    c = ask(client(srv, tokenizer="whitespace"), prompt="one two three", system="sys ")
    assert c.usage_estimated and c.meta["token_counter"] == "whitespace"
    assert (c.prompt_tokens, c.completion_tokens, c.cached_prompt_tokens) == (4, 4, 0)
    c = ask(client(srv, stream=False), prompt="x" * 40)
    assert c.usage_estimated and c.prompt_tokens == 10  # chars/4 without a tokenizer


def test_stop_strings_apply_even_if_the_server_ignores_them(serve):
    srv = serve(ok())
    c = ask(client(srv), prompt="42 Question: more", stop=(" Question",))
    assert c.text == "echo 42" and c.meta["stop_applied_locally"]
    assert srv.requests[-1][2]["stop"] == [" Question"]


def test_batch_runs_concurrently_in_order(serve):
    srv = serve(ok(delay=0.4))
    llm = client(srv, max_concurrency=4, stream=False)
    out = llm.generate([GenerationRequest(prompt=f"q{i}") for i in range(8)])
    assert [c.text for c in out] == [f"echo q{i}" for i in range(8)]
    assert 2 <= srv.peak <= 4  # requests overlapped at the server, never more than the bound


def test_waiting_for_a_concurrency_slot_is_queue_time_not_time_to_first_token(serve):
    # one slot, three requests: the third waits for two answers before it is even sent
    srv = serve(ok(first_delay=0.3))
    out = client(srv, max_concurrency=1).generate([GenerationRequest(f"q{i}") for i in range(3)])
    first, _, third = out
    assert first.queue_seconds < 0.2 <= 0.5 <= third.queue_seconds
    assert third.prefill_seconds < third.queue_seconds  # its own time to first token only
    # its latency is its own time: the slot it waited for is the harness's queue
    assert third.latency_seconds == pytest.approx(third.prefill_seconds + third.decode_seconds)
    # charged its share of the server's busy time: alone on it, its own time, not its queue
    assert third.meta["resource_seconds_basis"] == "server_busy_share"
    assert third.resource_seconds == pytest.approx(
        third.prefill_seconds + third.decode_seconds, abs=0.01
    )


def test_a_failed_request_fails_the_batch_and_reports_the_finished(serve, tmp_path):
    def behave(h, body, n):
        if "bad" in user_text(body):
            return status(422, "unprocessable")(h, body, n)
        return ok(delay=0.2)(h, body, n)

    srv = serve(behave)
    reqs = [GenerationRequest(prompt=p) for p in ("a", "b", "bad", "c")]
    with pytest.raises(LLMRequestError, match="HTTP 422") as err:
        client(srv, max_concurrency=4).generate(reqs)
    assert sorted(err.value.partial) == [0, 1, 3]
    assert err.value.partial[3].text == "echo c"
    # behind the completion cache the finished ones are kept, so a rerun only repeats the failure
    cached = CachedLLM(client(srv, max_concurrency=4), tmp_path / "c.sqlite")
    with pytest.raises(LLMRequestError):
        cached.generate(reqs)
    assert len(cached) == 3
    before = len(srv.requests)
    with pytest.raises(LLMRequestError):
        cached.generate(reqs)
    assert len(srv.requests) == before + 1


def test_api_key_is_sent_but_never_leaks(serve, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    srv = serve(
        sequence(
            ok(), status(401, lambda h: f"Incorrect API key provided: {h.headers['Authorization']}")
        )
    )
    llm = client(srv, api_key=SECRET, max_retries=0)
    c = ask(llm)
    assert srv.requests[0][1]["Authorization"] == f"Bearer {SECRET}"
    with pytest.raises(LLMRequestError) as err:
        ask(llm)
    assert "HTTP 401: Incorrect API key provided: Bearer ***" in str(err.value)
    surfaces = [
        str(err.value),
        repr(err.value),
        repr(llm),
        str(vars(llm)),
        json.dumps(llm.identity()),
        c.to_json(),
        caplog.text,
    ]
    assert "api_key='***'" in repr(llm)
    for text in surfaces:
        assert SECRET not in text
    # from the environment: RAGBENCH_API_KEY wins, OPENAI_BASE_URL gives the server
    monkeypatch.setenv("OPENAI_BASE_URL", srv.url)
    monkeypatch.setenv("RAGBENCH_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "other")
    srv.behave = ok()
    env_llm = load_llm("openai", model="m")
    ask(env_llm)
    assert srv.requests[-1][1]["Authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(env_llm) + str(vars(env_llm))
    assert env_llm.identity() == {
        "backend": "openai",
        "url": srv.url + "/chat/completions",
        "model": "m",
        "endpoint": "chat",
        "revision": "",
    }


URL_PASSWORD = "pw-7Hq2-NOT-LEAKED"
URL_TOKEN = "tok-5Kd9-NOT-LEAKED"
HEADER_SECRET = "hdr-3Jx8-NOT-LEAKED"


def secret_url(srv, path: str = "/v1") -> str:
    return (
        f"http://alice:{URL_PASSWORD}@127.0.0.1:{srv.port}{path}"
        f"?api-version=2024-06-01&token={URL_TOKEN}"
    )


def test_url_credentials_and_headers_are_sent_right_and_never_shown(serve, monkeypatch, caplog):
    for name in KEY_ENV:
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.DEBUG)  # httpx logs each request URL at INFO

    def echo_credentials(h):
        return f"denied {h.path} {h.headers['Authorization']} {h.headers['X-Gateway-Key']}"

    srv = serve(sequence(ok(), ok(), status(401, echo_credentials)))
    headers = {"X-Gateway-Key": HEADER_SECRET}
    keyed = client(srv, base_url=secret_url(srv), api_key=SECRET, headers=headers, max_retries=0)
    c = ask(keyed)
    path, sent, _ = srv.requests[0]
    # the query stays on the request (api-version), the key goes as Bearer only, not Basic
    assert path == f"/v1/chat/completions?api-version=2024-06-01&token={URL_TOKEN}"
    assert sent["Authorization"] == f"Bearer {SECRET}" and sent["X-Gateway-Key"] == HEADER_SECRET
    # without a key, the URL's user:password is the credential: HTTP Basic auth
    basic = client(srv, base_url=secret_url(srv), headers=headers)
    ask(basic)
    expected = base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode()
    assert srv.requests[1][1]["Authorization"] == f"Basic {expected}"
    with pytest.raises(LLMRequestError, match="HTTP 401: denied") as err:
        ask(keyed)
    shown = f"http://127.0.0.1:{srv.port}/v1/chat/completions?api-version=2024-06-01&token=***"
    assert keyed.url == shown and keyed.identity()["url"] == shown
    assert f"POST {shown} failed after 1 attempt(s)" in str(err.value)
    assert "headers=['X-Gateway-Key']" in repr(keyed)
    surfaces = [str(err.value), repr(err.value), c.to_json(), caplog.text]
    for llm in (keyed, basic):
        surfaces += [repr(llm), str(vars(llm)), json.dumps(llm.identity())]
    for text in surfaces:
        for secret in (SECRET, URL_PASSWORD, URL_TOKEN, HEADER_SECRET):
            assert secret not in text
    # headers given as model params (a config's model.params) reach the backend
    srv.behave = ok()
    ask(load_llm("openai", model="m", base_url=srv.url, headers={"X-Org": "team-a"}))
    assert srv.requests[-1][1]["X-Org"] == "team-a"
    with pytest.raises(ValueError, match="headers must map header names to string values"):
        OpenAICompatLLM(model="m", base_url=srv.url, headers={"X-Retries": 3})


def test_cache_identity_names_the_endpoint_but_no_credentials(serve):
    """Two servers behind one host:port are two models; a new password or token is not."""
    srv = serve(ok())
    root = f"127.0.0.1:{srv.port}"
    request = GenerationRequest(prompt="p")

    def key(base_url: str, **kw) -> str:
        return request_key(client(srv, base_url=base_url, **kw).identity(), request)

    a = key(f"http://{root}/a/v1")
    ask(client(srv, base_url=f"http://{root}/a/v1"))
    assert srv.requests[-1][0] == "/a/v1/chat/completions"  # the path prefix really is served
    assert key(f"http://{root}/b/v1") != a
    assert key(f"http://u:{URL_PASSWORD}@{root}/a/v1") == a
    assert key(f"http://u:other@{root}/a/v1", api_key="k2", headers={"X-Key": "h2"}) == a
    with_token = key(f"http://{root}/a/v1?api-version=1&token={URL_TOKEN}")
    assert with_token == key(f"http://{root}/a/v1?api-version=1&token=rotated") != a
    assert key(f"http://{root}/a/v1?api-version=2&token={URL_TOKEN}") != with_token
    ident = client(srv, base_url=secret_url(srv, "/a/v1"), api_key=SECRET).identity()
    assert ident["url"] == (f"http://{root}/a/v1/chat/completions?api-version=2024-06-01&token=***")
    assert not {URL_PASSWORD, URL_TOKEN, SECRET, "alice"} & set(json.dumps(ident).split('"'))


def test_a_batch_error_gives_each_failed_request_its_own_error(serve):
    def behave(h, body, n):
        text = user_text(body)
        if text.startswith("bad"):
            return status(500, f"cannot do {text}")(h, body, n)
        return ok()(h, body, n)

    srv = serve(behave)
    prompts = ["a", "bad 1", "b", "bad 2"]
    with pytest.raises(LLMBatchError) as err:
        client(srv, max_retries=2, max_concurrency=2).generate(
            [GenerationRequest(prompt=p) for p in prompts]
        )
    exc = err.value
    assert sorted(exc.partial) == [0, 2] and sorted(exc.errors) == [1, 3]
    assert str(exc).startswith("2 of 4 requests failed; the first: POST ")
    for i in (1, 3):
        assert exc.errors[i].attempts == 3
        assert f"failed after 3 attempt(s): HTTP 500: cannot do {prompts[i]}" in str(exc.errors[i])
    sent = [user_text(body) for _, _, body in srv.requests]
    assert sorted(sent) == ["a", "b", "bad 1", "bad 1", "bad 1", "bad 2", "bad 2", "bad 2"]


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_fails_fast_and_names_the_url_of_a_dead_server(tmp_path):
    port = dead_port()
    url = f"http://alice:{URL_PASSWORD}@127.0.0.1:{port}/v1?token={URL_TOKEN}"
    llm = OpenAICompatLLM(model="m", base_url=url, api_key=SECRET, sleep=lambda s: None)
    cached = CachedLLM(llm, tmp_path / "c.sqlite")  # the runner's LLM: the check goes through
    t0 = time.perf_counter()
    with pytest.raises(ServerUnreachable) as err:
        cached.check()
    assert time.perf_counter() - t0 < 10
    msg = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in msg
    assert f"GET http://127.0.0.1:{port}/v1/models?token=*** " in msg and "cannot connect" in msg
    for secret in (SECRET, URL_PASSWORD, URL_TOKEN):
        assert secret not in msg


def test_check_passes_a_live_server_and_explains_a_refusal(serve):
    srv = serve(ok())
    client(srv, api_key=SECRET).check()
    assert srv.gets == [("/v1/models", srv.gets[0][1])] and not srv.requests
    assert srv.gets[0][1]["Authorization"] == f"Bearer {SECRET}"
    # /models is optional in OpenAI-compatible servers: a 404 there means the server is up
    client(serve(ok(), get=status(404, "Not Found"))).check()

    refusing = serve(ok(), get=status(401, "Incorrect API key provided"))
    with pytest.raises(
        ServerUnreachable,
        match="HTTP 401: Incorrect API key provided; the server "
        "refused our credentials \\(check the API key in RAGBENCH_API_KEY",
    ):
        client(refusing).check()
    loading = serve(ok(), get=status(503, "model is loading"))
    with pytest.raises(ServerUnreachable, match="models: HTTP 503: model is loading"):
        client(loading).check()
    assert len(loading.gets) == 1  # no retries: a check is one short request
    hung = serve(ok(), get=hang(2.0))
    t0 = time.perf_counter()
    with pytest.raises(ServerUnreachable, match=r"no answer within 0.3 s \(ReadTimeout\)"):
        client(hung).check(timeout=0.3)
    assert time.perf_counter() - t0 < 1.5


def test_missing_configuration_is_explained(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with pytest.raises(ValueError, match="OPENAI_BASE_URL"):
        OpenAICompatLLM(model="m")
    with pytest.raises(ValueError, match="OPENAI_MODEL"):
        OpenAICompatLLM(base_url="http://127.0.0.1:1/v1")


# ---------------------------------------------------------------------------- real server (slow)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_serve(tmp_path_factory):
    """`transformers serve` on loopback with the embedded SmolLM2, converted once to safetensors
    (the server cannot load the GGUF itself); the model is named by its folder in each request."""
    pytest.importorskip("uvicorn", reason="needs transformers[serving] (dev extras)")
    from ragbench.assets import smollm2_gguf
    from ragbench.llm.gguf import convert_gguf

    folder = convert_gguf(smollm2_gguf())
    exe = Path(sys.executable).parent / "transformers"
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve not ready in 120 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", str(folder)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


NEEDLE_PROMPT = (
    "The grass is green. The sky is blue. The special magic number is 7463343. The sun is "
    "yellow.\n\nWhat is the special magic number mentioned in the text above?"
)


@pytest.mark.slow
def test_real_server_chat_usage_and_concurrency(transformers_serve):
    base_url, model = transformers_serve
    llm = OpenAICompatLLM(
        model=model,
        base_url=base_url,
        tokenizer="smollm2-135m-instruct",
        max_concurrency=2,
        timeout=300,
    )
    llm.check()  # a real server passes the pre-run check (it serves /v1/models)
    prompts = [NEEDLE_PROMPT, NEEDLE_PROMPT.replace("7463343", "5190724")]
    out = llm.generate([GenerationRequest(prompt=p, max_new_tokens=20) for p in prompts])
    assert "7463343" in out[0].text and "5190724" in out[1].text
    for c, p in zip(out, prompts, strict=True):
        assert not c.usage_estimated  # usage came from the server
        # the chat template adds tokens around the user text
        assert c.prompt_tokens > llm.count_tokens(p) and 0 < c.completion_tokens <= 20
        # and the local count of what was sent (used when a server reports no usage) is the
        # server's own count
        assert llm.prompt_tokens(GenerationRequest(prompt=p, max_new_tokens=20)) == c.prompt_tokens
        assert c.prefill_seconds > 0 and c.decode_seconds > 0 and c.meta["ttft_measured"]


@pytest.mark.slow
def test_real_server_completions_endpoint(transformers_serve):
    base_url, model = transformers_serve
    llm = OpenAICompatLLM(
        model=model, base_url=base_url, endpoint="completions", stream=False, timeout=300
    )
    c = llm.generate([GenerationRequest(prompt="The capital of France is", max_new_tokens=6)])[0]
    assert c.text.strip() and c.completion_tokens == 6 and c.finish_reason == "length"
    assert c.prompt_tokens == 5 and not c.usage_estimated


# ---------------------------------------------------------------------------- unreadable answers


def test_a_stream_cut_mid_event_is_retried_like_a_dropped_connection(serve):
    srv = serve(sequence(cut_mid_event(), ok()))
    c = ask(client(srv))
    assert c.text == "echo hello world" and c.meta["attempts"] == 2
    srv = serve(cut_mid_event())
    with pytest.raises(LLMRequestError) as err:
        ask(client(srv, max_retries=1))
    msg = str(err.value)
    assert re.match(
        rf"POST {re.escape(srv.url)}/chat/completions \(request {UUID4}\) failed after 2 "
        r"attempt\(s\): the event stream was cut short: it ended inside an event: event 2 is "
        r"not valid JSON \(Unterminated string starting at: line 1 column \d+\): '",
        msg,
    ), msg
    assert "\n" not in msg and len(srv.requests) == 2


def test_a_json_body_answering_a_streaming_request_is_read_as_a_completion(serve):
    srv = serve(ok(ignore_stream=True))
    c = ask(client(srv))  # stream=True by default
    assert c.text == "echo hello world" and c.finish_reason == "stop"
    assert srv.requests[0][2]["stream"] is True
    assert c.meta["ttft_measured"] is False and c.prefill_seconds == 0.0
    assert (c.prompt_tokens, c.cached_prompt_tokens) == (11, 4)
    # an event stream labelled as JSON is still read as events
    events = 'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n'
    c = ask(client(serve(raw(events + "data: [DONE]\n\n"))))
    assert c.text == "hi" and c.meta["ttft_measured"] is True


@pytest.mark.parametrize("stream", [True, False])
def test_an_unreadable_body_names_the_url_and_the_request_id_and_is_not_retried(serve, stream):
    srv = serve(raw('{"id": "x", "choices": [{"message": <html>bad gateway</html>'))
    with pytest.raises(LLMRequestError) as err:
        ask(client(srv, stream=stream))
    msg = str(err.value)
    sent = srv.requests[0][1]["X-Request-ID"]
    assert re.fullmatch(UUID4, sent)
    assert msg.startswith(
        f"POST {srv.url}/chat/completions (request {sent}) failed after 1 attempt(s): response "
        "is not valid JSON (Expecting value: line 1 column 37): "
    )
    assert "<html>bad gateway" in msg and "\n" not in msg and len(srv.requests) == 1
    # the server's own request id wins; JSON that is no completion is named as such
    srv = serve(raw("[1, 2]", headers={"x-request-id": "srv-42"}))
    with pytest.raises(
        LLMRequestError,
        match=r"\(request srv-42\) failed after 1 attempt\(s\): response is not a JSON object",
    ):
        ask(client(srv, stream=stream))


def test_a_bad_event_followed_by_more_is_an_error_not_a_cut(serve):
    body = "data: {oops\n\ndata: [DONE]\n\n"
    srv = serve(raw(body, content_type="text/event-stream"))
    with pytest.raises(
        LLMRequestError, match=rf"\(request {UUID4}\) failed .*: event 1 is not valid JSON"
    ):
        ask(client(srv))
    assert len(srv.requests) == 1  # the server answered: not retried


def test_embeddings_reply_that_is_not_json_names_the_request(serve):
    srv = serve(raw("<html>502</html>", content_type="text/html"))
    with pytest.raises(
        LLMRequestError,
        match=rf"/v1/embeddings \(request {UUID4}\) failed .*: response is not valid JSON",
    ):
        client(srv).post_json("embeddings", {"input": ["a"]})


def test_every_worker_keeps_its_connection(serve):
    """max_concurrency connections stay open between batches: no worker reconnects (a TLS
    handshake each time on a hosted API)."""
    ports: set[int] = set()
    answer = ok(delay=0.05)

    def behave(h, body, n):
        ports.add(h.client_address[1])  # one client port per connection
        answer(h, body, n)

    srv = serve(behave)
    llm = client(srv, stream=False, max_concurrency=24)
    for _ in range(3):
        outs = llm.generate([GenerationRequest(prompt=f"q{i}") for i in range(24)])
        assert [o.text for o in outs] == [f"echo q{i}" for i in range(24)]
    assert len(srv.requests) == 72
    assert len(ports) <= 24  # the connections of the first batch serve the next ones


# ---------------------------------------------------------------------------- interrupted runs


def _interrupt_config(tmp_path: Path, url: str) -> Path:
    cfg = {
        "name": "interrupted",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [300],
                "depth_percents": [10, 30, 50, 70, 90, 20, 40, 60],
                "needle": "\nThe special magic number is 3131313.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "3131313",
                "tokenizer": "whitespace",
            },
        },
        "model": {
            "backend": "openai",
            "name": "m",
            "max_new_tokens": 8,
            "batch_size": 8,
            "params": {
                "base_url": url,
                "api_key": "sk-test",
                "max_concurrency": 2,
                "tokenizer": "whitespace",
            },
        },
        "strategies": ["long_context"],
        "metrics": ["contains"],
        "price_sheet": "openai-gpt-4.1",
        "output_dir": str(tmp_path / "runs"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_interrupted_run_sends_nothing_more_and_its_rerun_pays_nothing_twice(
    serve, tmp_path, signame
):
    """Ctrl-C (or SIGTERM) during a round of a real `ragbench run`: no request is sent after
    the signal, the completions finished (and in flight) are kept in the completion cache, the
    manifest says interrupted, one line says so; the rerun sends none of them again."""
    import signal

    sig = getattr(signal, signame)
    srv = serve(ok(delay=0.6))  # 2 at a time: 8 requests take ~2.4 s
    config = _interrupt_config(tmp_path, srv.url)
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "RAGBENCH_CACHE": str(tmp_path / "cache"),  # the completion cache on, and fresh
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "ragbench.cli", "run", str(config), "--quiet"]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as in a terminal: a test run in the background would pass SIGINT on ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while len(srv.requests) < 3:  # the first two answered, the next two in flight
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no request reached the server"
        time.sleep(0.02)
    time.sleep(0.1)
    signalled = time.perf_counter()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    time.sleep(0.5)  # a request sent late would have reached the server by now
    assert proc.returncode == 128 + sig, (out, err)
    sent = [
        (body["messages"][-1]["content"], t)
        for (_, _, body), t in zip(srv.requests, srv.times, strict=True)
    ]
    assert 3 <= len(sent) < 8
    assert all(t < signalled for _, t in sent), "a request was sent after the signal"
    assert "interrupted: 0 records written" in err and "rerun to resume" in err, err
    kept = int(re.search(r"(\d+) finished completions kept", err).group(1))
    assert kept == len(sent)  # the ones in flight at the signal were waited for and kept
    (manifest,) = (tmp_path / "runs").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["status"] == "interrupted"

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    rerun = [body["messages"][-1]["content"] for _, _, body in srv.requests[len(sent) :]]
    assert rerun  # the rest of the work (prompts that repeat are sent once)
    assert not {p for p, _ in sent} & set(rerun), "the rerun paid again for kept completions"
    assert json.loads(manifest.read_text())["status"] == "finished"


def test_userinfo_set_aside_for_a_key_is_said_once(serve, tmp_path, caplog):
    """The run builds the backend twice (the preflight counts prompts with one): the warning
    that the URL's user:password is not sent, beside an API key, is one line, not two."""
    from ragbench.experiment.runner import run

    srv = serve(ok())
    url = srv.url.replace("http://", f"http://alice:{URL_PASSWORD}@")
    config = _interrupt_config(tmp_path, url)
    with caplog.at_level(logging.WARNING, logger="ragbench.llm.openai.compat"):
        df = run(str(config), progress=False)
    assert df["error"].isna().all()
    said = [r for r in caplog.records if "carries user:password" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert URL_PASSWORD not in said[0].getMessage()


def test_unusable_usage_is_named_and_never_a_count():
    assert usage_problem(None) is None and usage_problem({"prompt_tokens": 5}) is None
    assert usage_problem({"prompt_tokens": -1000}) == "prompt_tokens -1000 is not a token count"
    assert "completion_tokens" in usage_problem({"prompt_tokens": 5, "completion_tokens": "x"})
    assert "cached_tokens" in usage_problem(
        {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1.5}}
    )
    assert "not an object" in usage_problem([1, 2])
    assert usage_counts({"prompt_tokens": -1000, "completion_tokens": 5}) is None
    assert usage_counts({"prompt_tokens": 5.0, "completion_tokens": True}) is None


def test_negative_usage_from_the_server_is_estimated_and_the_run_goes_on(serve, tmp_path, caplog):
    """A server reporting prompt_tokens -1000 must not abort the run as bad input: each record
    counts its tokens locally (usage_estimated), naming what the server said."""
    from ragbench.experiment.runner import run

    def negative(h, body, n):
        msg = {"message": {"role": "assistant", "content": "3131313"}, "finish_reason": "stop"}
        usage = {"prompt_tokens": -1000, "completion_tokens": 5}
        send_json(h, 200, {"model": body["model"], "choices": [msg], "usage": usage})

    srv = serve(negative)
    c = ask(client(srv, tokenizer="whitespace"), prompt="one two three")
    assert c.usage_estimated and (c.prompt_tokens, c.completion_tokens) == (3, 1)
    assert c.meta["usage_rejected"] == "prompt_tokens -1000 is not a token count"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ragbench.llm.openai.compat"):
        df = run(str(_interrupt_config(tmp_path, srv.url)), progress=False)
    assert df["error"].isna().all() and len(df) >= 1
    assert df["usage_estimated"].all() and (df["prompt_tokens"] > 0).all()
    said = [r.getMessage() for r in caplog.records if "unusable token usage" in r.getMessage()]
    assert len(said) == 1 and "prompt_tokens -1000" in said[0]


def test_an_interrupted_batch_keeps_its_finished_completions_and_the_next_call_runs(serve, ctrl_c):
    """Ctrl-C in the calling thread: the queued requests are never sent, the ones in flight are
    waited for, every finished completion rides on the KeyboardInterrupt (``.partial``); the
    backend's next call is not stopped by it."""
    import signal
    import threading

    srv = serve(ok(delay=0.3))
    llm = client(srv, max_concurrency=2, stream=False)
    main = threading.main_thread().ident
    at_signal: list[int] = []

    def interrupt() -> None:
        while len(srv.requests) < 3:  # two answered (or nearly), the next ones sent
            time.sleep(0.01)
        at_signal.append(len(srv.requests))
        signal.pthread_kill(main, signal.SIGINT)

    helper = threading.Thread(target=interrupt)
    helper.start()
    with pytest.raises(KeyboardInterrupt) as info:
        llm.generate([GenerationRequest(prompt=f"q{i}") for i in range(8)])
    helper.join()
    time.sleep(0.5)  # a request sent late would have reached the server by now
    sent = len(srv.requests)
    assert at_signal[0] <= sent <= 4  # 2 answered, 2 in flight at most: nothing sent after
    # the ones in flight were waited for: every request sent has its completion
    assert sorted(info.value.partial) == list(range(sent))
    assert [info.value.partial[i].text for i in range(sent)] == [f"echo q{i}" for i in range(sent)]
    assert ask(llm, prompt="after").text == "echo after"
