"""The OpenAI-compatible backend at a server's limit, measured at its ``generate``.

A loopback server (aiohttp, in its own process so it does not share the client's GIL) answers
``/v1/chat/completions`` after sleeping L seconds, at most C requests at once (a semaphore):
its capacity is C/L requests per second. Streaming answers send the first token at L/2 and the
rest at L. Optionally it enforces a requests-per-minute limit the way hosted APIs do at a fine
grain (a token bucket holding one second's worth), answering every request with OpenAI's
``x-ratelimit-remaining-requests`` / ``x-ratelimit-reset-requests`` headers and an over-limit
one with a 429 (those headers, no ``Retry-After``).

Cases (C = 32, L = 0.2 s, 2,000 requests each, one ``generate`` call of all of them):

- ``throughput`` (non-streaming and streaming): ``OpenAICompatLLM(max_concurrency=C)`` against
  the unlimited server; ``throughput_vs_limit`` = achieved rps / (C/L), target >= 0.9; the
  per-request latency, time to first token and queue time (medians) show each request still
  sees its own L;
- ``rpm_limit``: the server enforces R = 3,600 RPM (60 rps, below its 160 rps capacity) and the
  client sets ``rate_limit: {requests_per_minute: 3600}``: achieved rate within 5% of R and
  zero 429s;
- ``server_headers``: the same server, the client told nothing: it learns the limit from the
  headers on every answer; ``server_429``: the server sends them with its 429s only, so the
  client learns from the 429s alone (each pauses every thread until the stated reset). Both:
  zero requests lost and no retry storm (requests sent / requests <= 1.1).

Records the CPU model, its flags and the load average before and after. Writes
benchmarks/results/http.json. Usage: ``python benchmarks/http_bench.py [--requests N] [--out PATH]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# (named http_bench.py, not http.py: a script named like the standard library's `http` package
# shadows it for every script in this folder.) The folder is dropped from the path all the same.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

ROOT = _HERE.parent
sys.path.insert(0, str(ROOT))

from ragbench.devices import cpu_flags  # noqa: E402
from ragbench.io import atomic_write_text  # noqa: E402
from ragbench.llm.calibration import cpu_name  # noqa: E402

C, L = 32, 0.2


# ---------------------------------------------------------------------------- the server


async def _stream(request, model: str, text: str, usage: dict, latency: float, headers: dict):
    """``text`` streamed word by word as server-sent events, the usage in the last event: half
    the latency before the first word, half before the last."""
    import asyncio

    from aiohttp import web

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
    await resp.prepare(request)
    await asyncio.sleep(latency / 2)
    words = text.split(" ")
    for i, w in enumerate(words):
        last = i == len(words) - 1
        choice = {"delta": {"content": w if i == 0 else " " + w}, "finish_reason": None}
        event = {"model": model, "choices": [choice]}
        if last:
            choice["finish_reason"] = "stop"
            event["usage"] = usage
            await asyncio.sleep(latency / 2)
        await resp.write(f"data: {json.dumps(event)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


def serve(concurrency: int, latency: float, rpm: float | None, headers_on_ok: bool) -> None:
    """Run the loopback server until stdin closes; print its port first. ``headers_on_ok``
    False: the rate-limit headers come with 429s only."""
    import asyncio

    from aiohttp import web

    sem = asyncio.Semaphore(concurrency)
    stats = {"requests": 0, "ok": 0, "rejected_429": 0, "peak_inflight": 0, "inflight": 0}
    rate = rpm / 60.0 if rpm else None
    capacity = rate * 1.0 if rate else None  # one second's worth: a fine-grained limit
    bucket = {"level": capacity, "at": time.monotonic()}

    def admit() -> tuple[bool, dict[str, str]]:
        if rate is None:
            return True, {}
        now = time.monotonic()
        bucket["level"] = min(capacity, bucket["level"] + (now - bucket["at"]) * rate)
        bucket["at"] = now
        admitted = bucket["level"] >= 1.0
        if admitted:
            bucket["level"] -= 1.0
        reset = (capacity - bucket["level"]) / rate  # until full again, as OpenAI means it
        return admitted, {
            "x-ratelimit-limit-requests": str(int(rpm)),
            "x-ratelimit-remaining-requests": str(int(bucket["level"])),
            "x-ratelimit-reset-requests": f"{reset * 1000:.0f}ms",
        }

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stats["requests"] += 1
        admitted, headers = admit()
        if admitted and not headers_on_ok:
            headers = {}
        if not admitted:
            stats["rejected_429"] += 1
            error = {"error": {"message": "Rate limit reached for requests", "code": 429}}
            return web.json_response(error, status=429, headers=headers)
        async with sem:
            stats["inflight"] += 1
            stats["peak_inflight"] = max(stats["peak_inflight"], stats["inflight"])
            try:
                text = "echo " + body["messages"][-1]["content"]
                usage = {"prompt_tokens": 12, "completion_tokens": 3}
                if not body.get("stream"):
                    await asyncio.sleep(latency)
                    msg = {
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                    stats["ok"] += 1
                    return web.json_response(
                        {"model": body["model"], "choices": [msg], "usage": usage},
                        headers=headers,
                    )
                resp = await _stream(request, body["model"], text, usage, latency, headers)
                stats["ok"] += 1
                return resp
            finally:
                stats["inflight"] -= 1

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats)

    async def reset_stats(request: web.Request) -> web.Response:
        stats.update(requests=0, ok=0, rejected_429=0, peak_inflight=0)
        bucket.update(level=capacity, at=time.monotonic())
        return web.json_response(stats)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", complete)
        app.router.add_get("/stats", get_stats)
        app.router.add_post("/reset", reset_stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
        await runner.cleanup()

    asyncio.run(main())


class Server:
    """The server in a child process (``python benchmarks/http_bench.py --serve ...``)."""

    def __init__(self, rpm: float | None = None, headers_on_ok: bool = True):
        cmd = [
            sys.executable,
            __file__,
            "--serve",
            str(C),
            str(L),
            str(rpm or 0),
            str(int(headers_on_ok)),
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def call(self, method: str, path: str) -> dict:
        import httpx

        return httpx.request(method, self.url + path, timeout=10).json()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


# ---------------------------------------------------------------------------- the cases


def measure(server: Server, n: int, stream: bool, rate_limit: dict | None) -> dict:
    from ragbench.llm.openai.compat import OpenAICompatLLM
    from ragbench.types import GenerationRequest

    llm = OpenAICompatLLM(
        model="m",
        base_url=server.url + "/v1",
        max_concurrency=C,
        stream=stream,
        timeout=60,
        rate_limit=rate_limit,
    )
    warm = [GenerationRequest(prompt=f"warm {i}", max_new_tokens=4) for i in range(C)]
    llm.generate(warm)  # connections opened and kept: a run's steady state
    time.sleep(1.5)  # the server's rate bucket refills after the warm-up
    server.call("POST", "/reset")
    requests = [GenerationRequest(prompt=f"question {i}", max_new_tokens=4) for i in range(n)]
    t0 = time.perf_counter()
    outs = llm.generate(requests)
    wall = time.perf_counter() - t0
    stats = server.call("GET", "/stats")
    llm.close()
    ok = sum(o.text == f"echo question {i}" for i, o in enumerate(outs))
    med = lambda xs: round(statistics.median(xs), 4)  # noqa: E731
    return {
        "requests": n,
        "completed": ok,
        "lost": n - ok,
        "wall_seconds": round(wall, 3),
        "achieved_rps": round(n / wall, 2),
        "requests_sent": stats["requests"],
        "sent_per_request": round(stats["requests"] / n, 4),
        "server_429s": stats["rejected_429"],
        "server_peak_inflight": stats["peak_inflight"],
        "median_latency_seconds": med([o.prefill_seconds + o.decode_seconds for o in outs]),
        "median_ttft_seconds": med([o.prefill_seconds for o in outs]) if stream else None,
        "median_queue_seconds": med([o.queue_seconds for o in outs]),
        "limiter_pauses": llm.limiter.pauses,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rpm", type=float, default=3600.0, help="the server's limit (RPM)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/http.json")
    args = parser.parse_args(argv)
    n, rpm = args.requests, args.rpm
    limit = C / L
    result: dict = {
        "benchmark": "http",
        "what": "OpenAICompatLLM.generate against a loopback server (sleeps L, serves C at once)",
        "cpu_model": cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": " ".join(cpu_flags()),
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "concurrency": C,
        "latency_seconds": L,
        "server_limit_rps": limit,
        "cases": {},
    }
    server = Server()
    try:
        for stream in (False, True):
            r = measure(server, n, stream, None)
            r["throughput_vs_limit"] = round(r["achieved_rps"] / limit, 3)
            result["cases"]["throughput_stream" if stream else "throughput"] = r
            print(("stream " if stream else "") + json.dumps(r), flush=True)
    finally:
        server.close()

    def limited(server: Server, case: str, label: str, rate_limit: dict | None) -> None:
        """One case against a server that limits to ``rpm``: its rate against that limit."""
        r = measure(server, n, False, rate_limit)
        r["limit_rps"] = rpm / 60
        r["rate_vs_limit"] = round(r["achieved_rps"] / (rpm / 60), 4)
        result["cases"][case] = r
        print(f"{label} " + json.dumps(r), flush=True)

    server = Server(rpm)
    try:
        limited(server, "rpm_limit", "rpm", {"requests_per_minute": rpm})
        limited(server, "server_headers", "headers", None)
    finally:
        server.close()
    server = Server(rpm, headers_on_ok=False)  # the client learns the limit from 429s alone
    try:
        limited(server, "server_429", "429", None)
    finally:
        server.close()
    cases = result["cases"]
    result["load_end"] = [round(x, 2) for x in os.getloadavg()]
    result["targets"] = {
        "throughput_vs_limit>=0.9": cases["throughput"]["throughput_vs_limit"] >= 0.9
        and cases["throughput_stream"]["throughput_vs_limit"] >= 0.9,
        "rpm_rate_within_5pct": abs(cases["rpm_limit"]["rate_vs_limit"] - 1) <= 0.05,
        "rpm_zero_429s": cases["rpm_limit"]["server_429s"] == 0,
        "429_zero_lost": cases["server_429"]["lost"] == 0 and cases["server_headers"]["lost"] == 0,
        "429_sent_per_request<=1.1": cases["server_429"]["sent_per_request"] <= 1.1
        and cases["server_headers"]["sent_per_request"] <= 1.1,
    }
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["targets"]))
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]) or None, sys.argv[5] == "1")
    else:
        main()
