"""Real users' failures against OpenAI-compatible servers (issue 45), each reproduced on the
loopback server (``openai_server.py``): a server that validates ``X-Request-ID`` as a UUID, a
server that refuses what the run sends (found by the preflight, before the run), token counts
when a server reports no usage (what was sent, chat template included), and a hung server (a
request's deadline, one Ctrl-C or SIGTERM answered in seconds)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from openai_server import (
    ask,
    client,
    empty_400,
    hang,
    ok,
    send_json,
    sequence,
    serving,
    status,
)
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.llm.openai.compat import OpenAICompatLLM
from ragbench.llm.openai.http import LLMRequestError, RetryPolicy
from ragbench.llm.openai.payload import build_payload
from ragbench.llm.openai.preflight import ServerRefused
from ragbench.tokenizers import get_tokenizer
from ragbench.types import GenerationRequest

serve = pytest.fixture(serving, name="serve")
SECRET = "sk-issue45-0a9b8c7d-NOT-LEAKED"
HEADER_SECRET = "hdr-issue45-5e6f-NOT-LEAKED"
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
ROOT = Path(__file__).resolve().parents[1]


def served_config(tmp_path: Path, url: str, **params) -> Path:
    """A small needle-in-a-haystack run (8 long-context records) against ``url``."""
    cfg = {
        "name": "served",
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
                **params,
            },
        },
        "strategies": ["long_context"],
        "metrics": ["contains", "string_match_all"],
        "output_dir": str(tmp_path / "runs"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


# ---------------------------------------------------------------------------- 1. request ids


def test_the_loopback_server_refuses_request_ids_as_llama_cpp_python_does(serve):
    srv = serve(ok(), uuid_request_ids=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{srv.url}/chat/completions"
    refused = httpx.post(url, json=body, headers={"X-Request-ID": "ragbench-0123456789abcdef"})
    assert (refused.status_code, refused.content) == (400, b"")  # no reason given
    answered = httpx.post(url, json=body, headers={"X-Request-ID": str(uuid.uuid4())})
    assert answered.status_code == 200 and answered.json()["choices"]


def test_each_attempt_sends_its_own_uuid_which_a_validating_server_accepts(serve):
    srv = serve(sequence(status(503, "loading"), ok()), uuid_request_ids=True)
    llm = client(srv)
    llm.check()  # the preflight's completion is validated too
    c = ask(llm)
    assert c.text == "echo hello world" and c.meta["attempts"] == 2
    ids = [h["X-Request-ID"] for _, h, _ in [*srv.probes, *srv.requests]]
    assert all(re.fullmatch(UUID4, i) for i in ids), ids
    assert len(set(ids)) == 3  # one per attempt: a retry is not the same attempt again

    # the embeddings route (the server embedder) sends the same ids
    def embeddings(h, body, n):
        send_json(h, 200, {"data": [{"index": 0, "embedding": [1.0]}]})

    vectors = serve(embeddings, uuid_request_ids=True)
    assert client(vectors).post_json("embeddings", {"input": ["a"]})["data"]


# ---------------------------------------------------------------------------- 2. the preflight


SHAPES = [("chat", True), ("chat", False), ("completions", True)]


@pytest.mark.parametrize(("endpoint", "stream"), SHAPES)
def test_the_preflight_sends_one_token_shaped_and_headed_as_the_runs_requests(
    serve, endpoint, stream
):
    srv = serve(ok())
    headers = {"X-Gateway-Key": HEADER_SECRET}
    llm = client(srv, api_key=SECRET, headers=headers, endpoint=endpoint, stream=stream)
    llm.check()
    assert len(srv.gets) == 1 and len(srv.probes) == 1 and not srv.requests
    path, probe_headers, probe = srv.probes[0]
    ask(llm, prompt="The document.\n\nQuestion: what?", stop=("\n\n",))
    sent_path, sent_headers, sent = srv.requests[0]
    assert probe["max_tokens"] == 1 and path == sent_path
    assert set(probe) == set(sent)  # the payload's shape: the same keys
    assert {k: v for k, v in probe.items() if k not in ("messages", "prompt", "max_tokens")} == {
        k: v for k, v in sent.items() if k not in ("messages", "prompt", "max_tokens")
    }  # the same values besides the prompt and the one token (stream, stop, temperature...)
    assert set(probe_headers) == set(sent_headers)  # the same headers, credentials included
    assert probe_headers["Authorization"] == f"Bearer {SECRET}"
    assert probe_headers["X-Gateway-Key"] == HEADER_SECRET


def test_a_server_refusing_the_runs_requests_stops_the_run_before_it_starts(serve, tmp_path):
    srv = serve(ok(), probe=status(400, "stream_options: extra inputs are not permitted"))
    config = served_config(tmp_path, srv.url)
    result = CliRunner().invoke(app, ["run", str(config), "--quiet"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"error: OpenAI-compatible server check failed: POST {srv.url}/chat/completions (one "
        "1-token completion sent as the run's): HTTP 400: stream_options: extra inputs are not "
        "permitted. Nothing was run"
    )
    assert srv.requests == [] and not list(tmp_path.glob("runs/*/records.jsonl"))


def test_a_refusal_without_a_reason_names_what_the_request_carried_never_values(serve):
    srv = serve(empty_400, probe=empty_400)
    llm = client(srv, api_key=SECRET, headers={"X-Gateway-Key": HEADER_SECRET})
    with pytest.raises(ServerRefused) as err:
        llm.check()
    msg = str(err.value)
    assert (
        "HTTP 400: (the server gave no reason) POST /v1/chat/completions carried the headers "
        in msg
    )
    for name in ("Authorization", "X-Gateway-Key", "X-Request-ID", "Content-Type", "User-Agent"):
        assert name in msg, msg
    keys = "max_tokens, messages, model, stop, stream, stream_options, temperature"
    assert f"the payload keys {keys};" in msg
    assert SECRET not in msg and HEADER_SECRET not in msg and "Bearer" not in msg
    # a request of the run refused the same way says the same (not retried: a 400 repeats)
    with pytest.raises(LLMRequestError) as err:
        ask(llm)
    assert "failed after 1 attempt(s): HTTP 400: (the server gave no reason) POST " in str(
        err.value
    )
    assert "payload keys max_tokens, messages" in str(err.value) and len(srv.requests) == 1
    assert SECRET not in str(err.value) and HEADER_SECRET not in str(err.value)


def test_a_rate_limited_preflight_passes(serve):
    srv = serve(ok(), probe=status(429, "slow down", {"Retry-After": "1"}))
    client(srv).check()  # the server is up; the run's requests wait as it asks
    assert len(srv.probes) == 1


# ---------------------------------------------------------------------------- 3. token counts


def long_prompt(words: int = 2500) -> str:
    """A long context (about 5k tokens of SmolLM2's tokenizer) and a question after it."""
    body = " ".join(
        f"Line {i}: the archive lists item {i * 7 % 1000} as stored." for i in range(words // 9)
    )
    return f"{body}\n\nWhat is stored as item 42?"


@pytest.mark.parametrize("stream", [True, False])
def test_without_usage_the_tokens_counted_are_those_sent_chat_template_included(serve, stream):
    tok = get_tokenizer("smollm2-135m-instruct")
    srv = serve(ok(usage=False))
    llm = client(srv, tokenizer="smollm2-135m-instruct", stream=stream)
    prompt, system = long_prompt(), "Answer with the item's number."
    c = ask(llm, prompt=prompt, system=system)
    messages = srv.requests[-1][2]["messages"]
    sent = tok.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = len(tok.hf(sent, add_special_tokens=False)["input_ids"])
    assert c.usage_estimated and c.meta["token_counter"] == "smollm2-135m-instruct"
    assert c.prompt_tokens == expected > 4000
    assert expected > tok.count(system + prompt)  # the template's tokens count too
    # the completions endpoint sends its text as it is: that is what is counted
    raw = client(srv, tokenizer="smollm2-135m-instruct", stream=stream, endpoint="completions")
    c = ask(raw, prompt=prompt, system=system)
    assert c.prompt_tokens == tok.count(srv.requests[-1][2]["prompt"]) == tok.count(system + prompt)


def test_the_payload_count_is_the_window_checks_count():
    """What a request occupies in the window is what it sends, the template's tokens included
    (``LLM.generate`` checks the window with ``prompt_tokens``)."""
    tok = get_tokenizer("smollm2-135m-instruct")
    prompt = long_prompt()
    llm = OpenAICompatLLM(
        model="m", base_url="http://127.0.0.1:9/v1", tokenizer="smollm2-135m-instruct"
    )
    request = GenerationRequest(prompt=prompt, max_new_tokens=8)
    messages = build_payload(request, "m")["messages"]
    rendered = tok.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert llm.prompt_tokens(request) == tok.count(rendered) > tok.count(prompt)


# ---------------------------------------------------------------------------- 4. a hung server


def test_the_defaults_fail_a_dead_request_in_under_a_minute():
    llm = OpenAICompatLLM(model="m", base_url="http://127.0.0.1:9/v1")
    policy = llm.policy
    assert (policy.connect_timeout, policy.timeout, policy.max_retries) == (5.0, 25.0, 4)
    assert policy.deadline == 55.0 < 60  # no attempt starts, and no read waits, past it
    timeout = llm._client.timeout  # connect and read apart
    assert (timeout.connect, timeout.read) == (5.0, 25.0)
    # a caller's longer timeouts are never cut by the default deadline: one whole attempt
    assert RetryPolicy.of(300.0, 10.0).deadline == 310.0
    assert RetryPolicy.of(300.0, 10.0, 120.0).deadline == 120.0  # as given
    with pytest.raises(ValueError, match="deadline=0: .*must be seconds > 0"):
        OpenAICompatLLM(model="m", base_url="http://127.0.0.1:9/v1", deadline=0)


def test_a_hung_server_fails_a_request_at_its_deadline_with_one_line_per_retry(serve, caplog):
    srv = serve(hang(20))
    llm = OpenAICompatLLM(
        model="m",
        base_url=srv.url,
        stream=False,
        timeout=0.5,
        connect_timeout=0.5,
        deadline=2.5,
        max_retries=10,
        backoff_base=0.1,
    )
    t0 = time.perf_counter()
    with (
        caplog.at_level(logging.WARNING, logger="ragbench.llm.openai.http"),
        pytest.raises(LLMRequestError) as err,
    ):
        ask(llm)
    elapsed = time.perf_counter() - t0
    assert 1.5 < elapsed < 3.0 and err.value.attempts == 3  # not 11 attempts of 0.5 s
    assert str(err.value) == (
        f"POST {srv.url}/chat/completions failed after 3 attempt(s): timed out after 0.5 s with "
        "no answer (ReadTimeout); gave up after 2 s (deadline 2.5 s); a server that is only slow "
        "needs a longer timeout and deadline"
    )
    retries = [r.getMessage() for r in caplog.records]
    assert len(retries) == 2 and retries[0].startswith(
        f"POST {srv.url}/chat/completions: timed out after 0.5 s with no answer (ReadTimeout); "
        "retry 1 of 10 in 0.1 s; 2 s of its deadline left"
    ), retries
    # a read never waits past the deadline: a 5 s read timeout is cut to the 1.2 s left
    llm = client(srv, stream=False, timeout=5.0, deadline=1.2, max_retries=3)
    t0 = time.perf_counter()
    with pytest.raises(
        LLMRequestError, match=r"failed after 1 attempt\(s\): timed out after 1.2 s"
    ):
        ask(llm)
    assert time.perf_counter() - t0 < 2.0


def test_a_rate_limits_waits_do_not_count_against_the_deadline(serve):
    srv = serve(sequence(*[status(429, "slow down", {"Retry-After": "3"})] * 3, ok()))
    waits: list[float] = []
    llm = client(srv, deadline=1.5, backoff_max=5.0, sleep=waits.append)
    c = ask(llm)  # 9 s of waiting on a 1.5 s deadline: the server is alive, it said when
    assert c.meta["attempts"] == 4 and waits == [3.0, 3.0, 3.0]
    srv = serve(sequence(*[status(503, "busy", {"Retry-After": "3"})] * 3, ok()))
    with pytest.raises(LLMRequestError, match=r"after 1 attempt\(s\): HTTP 503: busy; gave up"):
        ask(client(srv, deadline=1.5, backoff_max=5.0))  # a 503's wait does count


def pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")}


def test_one_ctrl_c_cuts_the_requests_in_flight_within_two_seconds(serve, ctrl_c):
    srv = serve(hang(30))
    llm = client(srv, max_concurrency=2, stream=False, timeout=8.0)
    main = threading.main_thread().ident
    signalled: list[float] = []
    before = pool_threads()

    def interrupt() -> None:
        while len(srv.requests) < 2:  # both workers' requests in flight
            time.sleep(0.01)
        time.sleep(0.1)
        signalled.append(time.perf_counter())
        signal.pthread_kill(main, signal.SIGINT)

    helper = threading.Thread(target=interrupt)
    helper.start()
    with pytest.raises(KeyboardInterrupt) as info:
        llm.generate([GenerationRequest(prompt=f"q{i}") for i in range(4)])
    took = time.perf_counter() - signalled[0]
    helper.join()
    assert took < 2.0, took  # not the 8 s read timeout
    assert info.value.partial == {} and len(srv.requests) == 2  # the queued two never sent
    # the workers ended: their reads were cut, not left to time out
    deadline = time.monotonic() + 1.0
    while pool_threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pool_threads() - before
    srv.behave = ok()  # the next call opens new connections and runs
    assert ask(llm, prompt="after").text == "echo after"
    # one request alone is read in the calling thread: the interrupt ends its read at once
    srv.behave = hang(30)
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        ask(llm, prompt="alone")
    assert time.perf_counter() - t0 < 1.5


def test_sigterm_on_a_run_behind_a_hung_server_ends_it_in_seconds(serve, tmp_path):
    """`ragbench run` against a server that never answers, its requests' timeout 60 s: SIGTERM
    ends the process in seconds (the requests in flight cut), the run marked interrupted."""
    srv = serve(hang(120))
    config = served_config(tmp_path, srv.url, timeout=60)
    env = {
        **os.environ,
        "RAGBENCH_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "ragbench.cli", "run", str(config), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(srv.requests) < 2:  # both workers waiting on the server
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no request reached the server"
        time.sleep(0.02)
    time.sleep(0.2)
    signalled = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"SIGTERM did not end the run in 15 s:\n{err[-2000:]}")
    took = time.perf_counter() - signalled
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert took < 4.0, (took, err)
    assert "cutting the 2 request(s)" in err and "interrupted: 0 records written" in err, err
    (manifest,) = (tmp_path / "runs").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["status"] == "interrupted"
    assert len(srv.requests) == 2  # nothing sent after the signal
