"""A scripted OpenAI-compatible server on loopback for the HTTP backend's tests.

``serve(behave)`` (the fixture made from ``serving``) starts one; ``behave(handler, body, n)``
answers the n-th POST (``ok``, ``status``, ``hang``, ``drop``, ``sequence``; fault modes:
``ok(ignore_stream=True)`` answers a streaming request with one JSON body, ``cut_mid_event`` ends a
stream inside an event, ``raw`` sends any body with status 200). GETs (``/v1/models``) are
answered by ``get`` (by default a one-model list) and recorded apart in ``gets``, and the
preflight's one-token completion (its prompt is ``preflight.PROBE_PROMPT``) by ``probe`` (by
default ``ok()``), recorded apart in ``probes``: request counts stay those of generation
requests. Each request is recorded with its path (query included), headers and body.

``uuid_request_ids=True`` validates ``X-Request-ID`` as llama-cpp-python's server does
(starlette-context's request-id plugin): a header that is not a UUID gets HTTP 400 with an empty
body, whatever the request.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ragbench.llm.openai.compat import OpenAICompatLLM
from ragbench.llm.openai.preflight import PROBE_PROMPT
from ragbench.types import GenerationRequest

Behave = Callable[[BaseHTTPRequestHandler, dict, int], None]


def send_json(
    h: BaseHTTPRequestHandler, code: int, body: dict, headers: dict | None = None
) -> None:
    data = json.dumps(body).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def user_text(body: dict) -> str:
    return body["messages"][-1]["content"] if "messages" in body else body["prompt"]


def is_probe(body: dict) -> bool:
    """Whether a POST is the preflight's one-token completion."""
    return ("messages" in body or "prompt" in body) and PROBE_PROMPT in user_text(body)


def is_uuid(value: str | None) -> bool:
    try:
        uuid.UUID(value or "")
    except ValueError:
        return False
    return True


def empty_400(h: BaseHTTPRequestHandler, body: dict | None = None, n: int = 0) -> None:
    """llama-cpp-python's answer to an X-Request-ID that is not a UUID: 400, no body."""
    h.send_response(400)
    h.send_header("Content-Length", "0")
    h.end_headers()


def ok(
    delay: float = 0.0,
    first_delay: float = 0.0,
    between: float = 0.0,
    usage: bool = True,
    cut: bool = False,
    ignore_stream: bool = False,
) -> Behave:
    """Answer ``echo <prompt>``; streamed word by word when the request asks for it (unless
    ``ignore_stream``: one JSON body, as servers that do not stream answer)."""

    def behave(h, body, n):
        time.sleep(delay)
        text = f"echo {user_text(body)}"
        words = text.split(" ")
        use = {
            "prompt_tokens": 11,
            "completion_tokens": len(words),
            "prompt_tokens_details": {"cached_tokens": 4},
        }
        if not body.get("stream") or ignore_stream:
            msg = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            send_json(
                h,
                200,
                {"model": body["model"], "choices": [msg], **({"usage": use} if usage else {})},
            )
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")  # body ends when the connection closes
        h.end_headers()
        h.close_connection = True
        time.sleep(first_delay)
        for i, w in enumerate(words):
            last = i == len(words) - 1
            if cut and last:
                return  # the connection closes without a finish reason: a dropped stream
            delta = {
                "delta": {"content": w if i == 0 else " " + w},
                "finish_reason": "stop" if last else None,
            }
            chunk = {
                "model": body["model"],
                "choices": [delta],
                **({"usage": use} if usage and last else {}),
            }
            h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            h.wfile.flush()
            if not last:
                time.sleep(between)
        h.wfile.write(b"data: [DONE]\n\n")

    return behave


def status(code: int, message: str | Callable = "boom", headers: dict | None = None) -> Behave:
    def behave(h, body, n):
        text = message(h) if callable(message) else message
        send_json(h, code, {"error": {"message": text, "code": code}}, headers)

    return behave


def raw(body: str, content_type: str = "application/json", headers: dict | None = None) -> Behave:
    """Status 200 with ``body`` as it is (not JSON, HTML from a proxy, a JSON list...)."""

    def behave(h, req, n):
        data = body.encode()
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    return behave


def cut_mid_event() -> Behave:
    """A stream that sends one event, then half of the next, then closes the connection."""

    def behave(h, body, n):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        first = {"model": body["model"], "choices": [{"delta": {"content": "echo"}}]}
        h.wfile.write(f"data: {json.dumps(first)}\n\n".encode())
        h.wfile.write(b'data: {"model": "m", "choices": [{"delta": {"content": " hel')
        h.wfile.flush()

    return behave


def hang(seconds: float) -> Behave:
    return lambda h, body, n: time.sleep(seconds)


def drop() -> Behave:
    def behave(h, body, n):
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)  # no status line at all

    return behave


def sequence(*steps: Behave) -> Behave:
    """The n-th request gets step n; the last step repeats."""
    return lambda h, body, n: steps[min(n, len(steps) - 1)](h, body, n)


def models(h: BaseHTTPRequestHandler, body: None, n: int) -> None:
    """What vLLM answers on GET /v1/models."""
    send_json(h, 200, {"object": "list", "data": [{"id": "m", "object": "model"}]})


class Server:
    def __init__(
        self,
        behave: Behave,
        get: Behave = models,
        probe: Behave | None = None,
        uuid_request_ids: bool = False,
    ):
        self.behave, self.get, self.requests, self.times = behave, get, [], []
        self.probe, self.uuid_request_ids = probe or ok(), uuid_request_ids
        self.gets: list[tuple[str, dict]] = []
        self.probes: list[tuple[str, dict, dict]] = []
        self.inflight = self.peak = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                refused = server.uuid_request_ids and not is_uuid(self.headers["X-Request-ID"])
                if is_probe(body):
                    with server.lock:
                        server.probes.append((self.path, dict(self.headers), body))
                    answer = empty_400 if refused else server.probe
                    return answer(self, body, len(server.probes) - 1)
                if refused:
                    with server.lock:
                        server.requests.append((self.path, dict(self.headers), body))
                        server.times.append(time.perf_counter())
                    return empty_400(self)
                with server.lock:
                    n = len(server.requests)
                    server.requests.append((self.path, dict(self.headers), body))
                    server.times.append(time.perf_counter())
                    server.inflight += 1
                    server.peak = max(server.peak, server.inflight)
                try:
                    server.behave(self, body, n)
                finally:
                    with server.lock:
                        server.inflight -= 1

            def do_GET(self):
                with server.lock:
                    n = len(server.gets)
                    server.gets.append((self.path, dict(self.headers)))
                server.get(self, None, n)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        # a short poll interval: shutdown() at teardown waits for up to one poll
        poll = {"poll_interval": 0.02}
        threading.Thread(target=self.httpd.serve_forever, kwargs=poll, daemon=True).start()


def serving():
    """The ``serve`` fixture's body; a test module declares
    ``serve = pytest.fixture(serving, name="serve")``."""
    servers: list[Server] = []

    def start(behave: Behave, get: Behave = models, **options) -> Server:
        servers.append(Server(behave, get, **options))
        return servers[-1]

    yield start
    for s in servers:
        s.httpd.shutdown()
        s.httpd.server_close()


def client(srv: Server, **kw) -> OpenAICompatLLM:
    """A client of ``srv`` whose retries do not sleep (pass ``sleep=`` to record the waits)."""
    kw = {"model": "m", "base_url": srv.url, "timeout": 5.0, "sleep": lambda s: None, **kw}
    return OpenAICompatLLM(**kw)


def ask(llm, prompt="hello world", **kw):
    return llm.generate([GenerationRequest(prompt=prompt, **kw)])[0]
