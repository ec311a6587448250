"""OpenAI-compatible backend: pure payload/response functions, fault handling against a small
scripted HTTP server, the key never leaking, and (slow) a real `transformers serve` on loopback."""

from __future__ import annotations

import json
import logging
import os
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
    drop,
    hang,
    ok,
    sequence,
    serving,
    status,
    user_text,
)

from ragbench.llm import load_llm
from ragbench.llm.cache import CachedLLM
from ragbench.llm.openai_compat import (
    LLMRequestError,
    OpenAICompatLLM,
    backoff_seconds,
    parse_retry_after,
)
from ragbench.llm.openai_payload import (
    apply_stop,
    build_payload,
    endpoint_url,
    error_message,
    iter_sse_data,
    parse_chunk,
    parse_response,
    safe_url,
    usage_counts,
)
from ragbench.types import GenerationRequest

SECRET = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"

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
    assert c.decode_seconds == c.meta["latency_seconds"] > 0
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
        "host": srv.url.split("/")[2],
        "model": "m",
        "endpoint": "chat",
        "revision": "",
    }


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
    prompts = [NEEDLE_PROMPT, NEEDLE_PROMPT.replace("7463343", "5190724")]
    out = llm.generate([GenerationRequest(prompt=p, max_new_tokens=20) for p in prompts])
    assert "7463343" in out[0].text and "5190724" in out[1].text
    for c, p in zip(out, prompts, strict=True):
        assert not c.usage_estimated  # usage came from the server
        # the chat template adds tokens around the user text
        assert c.prompt_tokens > llm.count_tokens(p) and 0 < c.completion_tokens <= 20
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
