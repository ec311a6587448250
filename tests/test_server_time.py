"""A server's busy time split among its requests (``ragbench.llm.server_time``): the pure
processor-sharing split against a brute-force reference, the per-backend timeline, and a real
loopback OpenAI-compatible server at concurrency 16 whose busy wall time is what gets charged."""

from __future__ import annotations

import json
import random
import statistics
import threading
import time

import pytest
from openai_server import client, serving, user_text

from ragbench.cost.accounting import Cost
from ragbench.cost.prices import parse_price_sheet, resource_seconds_basis
from ragbench.llm.fake import FakeLLM
from ragbench.llm.server_time import (
    BusyTimeline,
    busy_shares,
    token_work,
    work_rate,
)
from ragbench.types import Completion, GenerationRequest

serve = pytest.fixture(serving, name="serve")


def busy_seconds(intervals: list) -> float:
    """The length of the union of the (start, end, ...) intervals: the time at least one was in
    flight."""
    total, reach = 0.0, float("-inf")
    for start, end, *_ in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


HOURLY = parse_price_sheet(
    {
        "name": "h",
        "kind": "gpu_hour",
        "date": "2025-01-01",
        "source": "test",
        "gpu_hour": 3.6,
        "gpus": 2,
    }
)

# ---------------------------------------------------------------------------- the pure split


def reference_shares(intervals, steps=20_000):
    """The same split by brute force: the timeline cut into tiny slices, each shared by weight."""
    lo = min(s for s, _, _ in intervals)
    hi = max(e for _, e, _ in intervals)
    dt = (hi - lo) / steps
    out = [0.0] * len(intervals)
    for k in range(steps):
        t = lo + (k + 0.5) * dt
        on = [i for i, (s, e, _) in enumerate(intervals) if s <= t < e]
        total = sum(intervals[i][2] for i in on)
        for i in on:
            out[i] += dt * (intervals[i][2] / total if total > 0 else 1 / len(on))
    return out


def test_a_lone_request_pays_its_whole_interval():
    assert busy_shares([(2.0, 5.5, 7.0)]) == [3.5]
    assert busy_shares([(2.0, 5.5, 0.0)]) == [3.5]  # no work reported: still its time


def test_idle_gaps_are_charged_to_nobody():
    shares = busy_shares([(0.0, 1.0, 1.0), (3.0, 4.0, 5.0)])
    assert shares == [1.0, 1.0]
    assert sum(shares) == busy_seconds([(0.0, 1.0), (3.0, 4.0)]) == 2.0  # not the 4 s span


def test_overlap_is_shared_by_weight():
    assert busy_shares([(0.0, 2.0, 1.0), (1.0, 3.0, 1.0)]) == [1.5, 1.5]
    assert busy_shares([(0.0, 1.0, 3.0), (0.0, 1.0, 1.0)]) == [0.75, 0.25]
    assert busy_shares([(0.0, 1.0, 0.0), (0.0, 1.0, 0.0)]) == [0.5, 0.5]  # no weights: equally
    # 16 requests at once, one with 4x the work: 4/19 of the second for it, 1/19 for each other
    shares = busy_shares([(0.0, 1.0, 4.0)] + [(0.0, 1.0, 1.0)] * 15)
    assert shares[0] == pytest.approx(4 / 19) and shares[1] == pytest.approx(1 / 19)
    assert sum(shares) == pytest.approx(1.0)


def test_shares_add_up_to_the_busy_time_and_match_brute_force():
    rng = random.Random(7)
    for _ in range(5):
        intervals = []
        for _ in range(40):
            s = rng.uniform(0, 10)
            intervals.append((s, s + rng.uniform(0, 2), rng.choice([0.0, rng.uniform(0, 5)])))
        shares = busy_shares(intervals)
        assert sum(shares) == pytest.approx(busy_seconds(intervals), rel=1e-12)
        assert shares == pytest.approx(reference_shares(intervals), abs=2e-3)
        assert all(0 <= x <= e - s + 1e-12 for x, (s, e, _) in zip(shares, intervals, strict=True))


def test_empty_and_degenerate_intervals():
    assert busy_shares([]) == [] and busy_seconds([]) == 0.0
    assert busy_shares([(1.0, 1.0, 5.0), (0.0, 2.0, 1.0)]) == [0.0, 2.0]  # no time, no charge
    with pytest.raises(ValueError, match="interval 1"):
        busy_shares([(0.0, 1.0, 1.0), (2.0, 1.0, 1.0)])
    with pytest.raises(ValueError, match="weight"):
        busy_shares([(0.0, 1.0, float("nan"))])


def test_work_is_what_the_server_computed_spread_over_the_request():
    assert token_work(Completion("x", 1000, 20, 600)) == 420  # the cached 600 were not computed
    assert work_rate(1.0, 3.0, 420) == 210.0 and work_rate(1.0, 1.0, 5) == 0.0
    # a long slow request (2,000 tokens over 40 s) beside a short busy one (1,000 in 1 s): by
    # rate the short one pays most of the second they share, not the long one
    long_, short = (0.0, 40.0, 2000), (10.0, 11.0, 1000)
    shares = busy_shares([(s, e, work_rate(s, e, w)) for s, e, w in (long_, short)])
    assert shares[1] > 0.9 and sum(shares) == pytest.approx(40.0)


# ---------------------------------------------------------------------------- the timeline


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_timeline_splits_a_call_and_forgets_what_no_later_call_can_overlap():
    clock = Clock()
    tl = BusyTimeline(clock)
    a, b = tl.start(), tl.start()  # both sent at 0
    tl.finish(a, 1.0, 100)
    tl.finish(b, 2.0, 100)  # rate 50/s against a's 100/s over the first second
    shares = tl.shares([a, b])
    assert shares[a] == pytest.approx(2 / 3) and shares[b] == pytest.approx(1 / 3 + 1)
    assert sum(shares.values()) == pytest.approx(2.0)
    assert tl._done == {}  # nothing in flight: every settled request forgotten
    clock.now = 10.0  # an idle gap, then a lone request
    c = tl.start()
    tl.finish(c, 10.5, 1)
    assert tl.shares([c]) == {c: pytest.approx(0.5)}
    tl.drop(tl.start())  # a failed attempt: nothing to charge, nothing left behind
    assert tl._flying == {} and tl.shares([]) == {}


def test_timeline_waits_for_an_overlapping_request_of_another_call():
    clock = Clock()
    tl = BusyTimeline(clock)
    other = tl.start()  # another thread's request, sent at 0, still in flight
    mine = tl.start()
    tl.finish(mine, 1.0, 10)

    def later():
        time.sleep(0.2)
        tl.finish(other, 3.0, 30)  # same rate (10/s): they split their common second

    threading.Thread(target=later).start()
    t0 = time.perf_counter()
    shares = tl.shares([mine])
    assert time.perf_counter() - t0 >= 0.15  # it waited for the overlapping request
    assert shares == {mine: pytest.approx(0.5)}
    assert tl.shares([other]) == {other: pytest.approx(2.5)}  # 0.5 + its 2 s alone


# ---------------------------------------------------------------------------- the cost column


def test_cost_names_its_resource_seconds_basis():
    served = Completion(
        "x",
        10,
        2,
        prefill_seconds=0.5,
        decode_seconds=0.5,
        resource_seconds=0.1,
        meta={"resource_seconds_basis": "server_busy_share"},
    )
    measured = Completion("x", 10, 2, resource_seconds=0.3)
    legacy_server = Completion(
        "x",
        10,
        2,
        prefill_seconds=0.5,
        decode_seconds=0.5,
        meta={"resource_seconds_estimated": True},
    )
    fake = FakeLLM().generate([GenerationRequest("What is the answer?")])[0]
    assert [resource_seconds_basis(c) for c in (served, measured, legacy_server, fake)] == [
        "server_busy_share",
        "device_measured",
        "slot_time",
        "simulated",
    ]
    cost = Cost.of(served, sheet=HOURLY)
    assert cost.resource_seconds_basis == "server_busy_share" and cost.resource_seconds == 0.1
    assert cost.dollars == pytest.approx(3.6 * 2 * 0.1 / 3600)  # the share, not its 1 s slot
    assert (cost + Cost.of(served, sheet=HOURLY)).resource_seconds_basis == "server_busy_share"
    assert (cost + Cost.of(measured)).resource_seconds_basis == "mixed"
    assert Cost.from_dict(cost.to_dict()) == cost
    old = cost.to_dict()
    del old["resource_seconds_basis"]  # a record written before the column
    assert Cost.from_dict(old).resource_seconds_basis is None


# ---------------------------------------------------------------------------- a real server

LATENCY = 0.3  # seconds the server takes for every request, whatever its size


class Latency:
    """Answers every request after ``LATENCY`` (streamed when asked), reporting usage by the
    prompt's words; records each request's time inside the server."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spans: list[tuple[float, float]] = []
        self.together: threading.Barrier | None = None  # set: answer a round all at once

    def __call__(self, h, body, n):
        t0 = time.perf_counter()
        if self.together is not None:  # every request of the round is inside before any answer
            self.together.wait(timeout=30)
        time.sleep(LATENCY)
        words = len(user_text(body).split())
        use = {"prompt_tokens": words, "completion_tokens": 4}
        chunk = {
            "model": body["model"],
            "usage": use,
            "choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}],
        }
        data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()
        with self.lock:
            self.spans.append((t0, time.perf_counter()))


def test_loopback_server_at_concurrency_16_is_charged_its_busy_time(serve):
    behave = Latency()
    srv = serve(behave)
    llm = client(srv, max_concurrency=16)
    requests = [GenerationRequest(f"question {i} " + "word " * 20) for i in range(64)]
    started = time.perf_counter()
    out = llm.generate(requests)
    wall = time.perf_counter() - started
    # 16 at a time: the server counts a request until its handler returns, after the client has
    # its answer and may have sent the next (17 seen beside a second pytest worker)
    assert 12 <= srv.peak <= 17
    busy = busy_seconds(behave.spans)  # measured at the server: time with a request inside
    charged = sum(c.resource_seconds for c in out)
    slots = sum(c.prefill_seconds + c.decode_seconds for c in out)  # what was charged before
    # the client charges the time it saw a request in flight: the server's busy time plus the
    # client's own HTTP handling (1.975 s against 1.836 s beside a second pytest worker; 2.32 s
    # against 1.64 s on a loaded CI machine). Bounds that hold under any load: at least what the
    # server saw, at most the call's wall time, far below the summed per-request slots.
    assert 0.9 * busy <= charged <= wall
    assert slots > 4 * charged  # the old over-charge: about the concurrency
    assert {c.meta["resource_seconds_basis"] for c in out} == {"server_busy_share"}
    costs = [Cost.of(c, sheet=HOURLY) for c in out]
    assert {c.resource_seconds_basis for c in costs} == {"server_busy_share"}
    assert sum(c.dollars for c in costs) == pytest.approx(3.6 * 2 * charged / 3600, rel=1e-9)
    print(
        f"\n64 requests at concurrency 16: busy {busy:.3f} s, charged {charged:.3f} s, "
        f"slot time {slots:.3f} s"
    )

    # in one round, a request with 4x the tokens pays more than the short ones beside it (the
    # server answers the round together: on a loaded machine the client's sends spread over
    # seconds, and a request alone in the server is charged the whole of that time)
    round_ = [GenerationRequest("long " * 80)] + [
        GenerationRequest(f"short {i} " + "w " * 18) for i in range(15)
    ]
    behave.together = threading.Barrier(len(round_))
    long_, *short = llm.generate(round_)
    behave.together = None
    assert long_.prompt_tokens == 4 * short[0].prompt_tokens == 80
    assert long_.resource_seconds > 2 * statistics.median(c.resource_seconds for c in short)
    # its latency is like theirs (the round is answered together): its size is not in it
    assert long_.latency_seconds < max(c.latency_seconds for c in short) + LATENCY


def test_calls_from_two_threads_share_one_timeline(serve):
    behave = Latency()
    llm = client(serve(behave), max_concurrency=8)
    out: dict[int, list[Completion]] = {}

    def call(k):
        out[k] = llm.generate([GenerationRequest(f"t{k} q{i}") for i in range(16)])

    threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    charged = sum(c.resource_seconds for cs in out.values() for c in cs)
    busy = busy_seconds(behave.spans)  # measured at the server: time with a request inside
    # once, not once per call: the two calls overlap from start to end, so a timeline per call
    # (each call split its time among its own requests only) charges about twice the busy time.
    # Once is what the client can observe: its own in-flight time, which is the server's plus
    # the client's HTTP handling (+7.6% seen beside a second pytest worker on 2 cores, 4 in 32
    # idle runs over 5%; +42% on a loaded CI machine), less only by the server's own bookkeeping
    # after its last byte. A timeline per call would charge about twice the wall time.
    assert 0.9 * busy <= charged <= wall, (charged, busy, wall)
    print(f"\ncharged {charged:.3f} s, busy {busy:.3f} s: {charged / busy:.3f}")


def test_a_failed_batch_charges_its_finished_requests_and_gaps_are_free(serve):
    behave = Latency()

    def fail_some(h, body, n):
        if "bad" in user_text(body):
            return h.send_error(422)
        return behave(h, body, n)

    llm = client(serve(fail_some), max_concurrency=4, max_retries=0)
    with pytest.raises(Exception) as err:
        llm.generate([GenerationRequest(p) for p in ("a", "b", "bad", "c")])
    partial = err.value.partial
    assert sorted(partial) == [0, 1, 3]
    # client-side intervals carry the client's own parsing: on a loaded 2-core machine up to ~10%
    # more than the server's spans; a charged gap or a charged failure would be 2x
    assert sum(c.resource_seconds for c in partial.values()) == pytest.approx(
        busy_seconds(behave.spans), rel=0.15
    )
    time.sleep(0.3)  # idle between calls: nobody's
    alone = llm.generate([GenerationRequest("d")])[0]
    assert alone.resource_seconds == pytest.approx(LATENCY, abs=0.1)
    assert llm.timeline._done == {} and llm.timeline._flying == {}
