"""Rate limits (``ragbench.llm.rate_limit``): the bucket's arithmetic and the limiter on an
injected clock (no sleeps), OpenAI's header formats, and against a real loopback server: a 429
with rate-limit headers is retried after the stated reset and no request is lost."""

from __future__ import annotations

import logging
import threading

import pytest
from openai_server import client, ok, send_json, sequence, serving, status

from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.resources import load_model
from ragbench.llm.rate_limit import (
    RESET_MARGIN,
    Bucket,
    RateLimiter,
    ServerLimits,
    Ticket,
    give_back,
    parse_duration,
    parse_headers,
    per_minute_bucket,
    refill,
    reserve,
)
from ragbench.types import GenerationRequest

serve = pytest.fixture(serving, name="serve")


class Clock:
    """A clock that only moves when someone sleeps on it; records the sleeps."""

    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


# ---------------------------------------------------------------------------- pure arithmetic


def test_bucket_refills_at_its_rate_up_to_capacity():
    b = Bucket(rate=2.0, capacity=4.0, level=0.0, at=0.0)
    assert refill(b, 1.0).level == 2.0
    assert refill(b, 10.0).level == 4.0  # capped
    assert refill(b, -1.0).level == 0.0  # a clock never runs back


def test_reserve_goes_negative_and_says_how_long_to_wait():
    b = per_minute_bucket(60, now=0.0)  # 1 request per second, a burst of one
    assert (b.rate, b.capacity, b.level) == (1.0, 1.0, 1.0)
    b, wait = reserve(b, 1, 0.0)
    assert wait == 0.0
    b, wait = reserve(b, 1, 0.0)  # the next one waits for its refill
    assert wait == pytest.approx(1.0)
    b, wait = reserve(b, 1, 0.5)  # and the one after it queues behind
    assert wait == pytest.approx(1.5)
    b, wait = reserve(per_minute_bucket(600, 0.0, burst=1.0), 25, 0.0)  # bigger: it passes
    assert wait == pytest.approx(1.5)  # 10/s, holding 10: 15 more tokens take 1.5 s


def test_give_back_never_overfills():
    b = per_minute_bucket(600, now=0.0, burst=1.0)  # 10 per second, holds 10
    b, _ = reserve(b, 8, 0.0)
    assert give_back(b, 3, 0.0).level == pytest.approx(5.0)
    assert give_back(b, 30, 0.0).level == pytest.approx(10.0)


def test_per_minute_limit_must_be_positive():
    with pytest.raises(ValueError, match="> 0"):
        per_minute_bucket(0, 0.0)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("2m", 120.0),
        (" 59.9s ", 59.9),
    ],
)
def test_parse_duration_reads_openais_formats(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "soon", "6x", "1s later"])
def test_parse_duration_unreadable_is_none(text):
    assert parse_duration(text) is None


def test_parse_headers_any_case_and_when_a_window_is_out():
    limits = parse_headers(
        {
            "X-RateLimit-Remaining-Requests": "0",
            "x-ratelimit-remaining-tokens": "1500",
            "x-ratelimit-reset-requests": "6m0s",
            "x-ratelimit-reset-tokens": "20ms",
        }
    )
    assert limits == ServerLimits(0, 1500, 360.0, 0.02)
    assert limits.exhausted_for() == 360.0  # the requests are out; tokens are not
    assert parse_headers({}).exhausted_for() is None


# ---------------------------------------------------------------------------- the limiter


def test_limiter_spaces_requests_at_the_rpm_limit():
    clock = Clock()
    lim = RateLimiter(requests_per_minute=120, clock=clock.now, sleep=clock.sleep)  # 2 per s
    for _ in range(5):
        lim.acquire()
    # a burst of one, then one every half second
    assert clock.t - 100.0 == pytest.approx(2.0)
    assert lim.waited == pytest.approx(2.0)


def test_limiter_counts_tokens_and_takes_back_what_an_answer_did_not_use():
    clock = Clock()
    lim = RateLimiter(tokens_per_minute=600, clock=clock.now, sleep=clock.sleep, burst_seconds=1)
    t = lim.acquire(tokens=10)  # 10 per second, holding 10: no wait
    assert clock.sleeps == []
    lim.settle(t, used_tokens=4)  # 6 come back
    lim.acquire(tokens=10)
    assert sum(clock.sleeps) == pytest.approx(0.4)  # only the 4 used had to refill


def test_server_headers_pause_everyone_until_the_reset():
    clock = Clock()
    lim = RateLimiter(clock=clock.now, sleep=clock.sleep)  # no configured limit: headers only
    first, _, _ = lim.acquire(), lim.acquire(), lim.acquire()
    # the first request's answer: 2 left when it was admitted; two were sent since -> none left
    headers = {"x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-requests": "3s"}
    lim.observe(first, 200, headers, None)
    lim.acquire()
    assert sum(clock.sleeps) == pytest.approx(3 + RESET_MARGIN)  # the reset, plus the margin
    lim.acquire()  # the window reset: unknown again, nothing to wait for
    assert sum(clock.sleeps) == pytest.approx(3 + RESET_MARGIN)


def test_an_older_answer_never_overrides_a_newer_one():
    clock = Clock()
    lim = RateLimiter(clock=clock.now, sleep=clock.sleep)
    a, b = lim.acquire(), lim.acquire()
    lim.observe(
        b, 200, {"x-ratelimit-remaining-requests": "50", "x-ratelimit-reset-requests": "1s"}, None
    )
    lim.observe(
        a, 200, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}, None
    )
    lim.acquire()
    assert clock.sleeps == []


def test_a_429_pauses_every_thread_for_its_retry_after():
    clock = Clock()
    lim = RateLimiter(clock=clock.now, sleep=clock.sleep)
    t = lim.acquire()
    lim.observe(t, 429, {}, 2.5)
    assert lim.pauses == 1
    lim.acquire()  # the thread that got the 429 waits in its own retry (tenacity): not twice
    assert clock.sleeps == []
    other = threading.Thread(target=lim.acquire)  # every other thread of the pool waits
    other.start()
    other.join()
    assert clock.sleeps == [pytest.approx(2.5)]


def test_limiter_of_a_config_mapping_names_the_valid_keys():
    assert RateLimiter.of({"requests_per_minute": 60}).requests_per_minute == 60
    unlimited = RateLimiter.of(None)
    assert (unlimited.requests_per_minute, unlimited.tokens_per_minute) == (None, None)
    with pytest.raises(ValueError, match="requests_per_minute, tokens_per_minute"):
        RateLimiter.of({"rpm": 60})
    shared = RateLimiter()
    assert RateLimiter.of(shared) is shared


def test_ticket_records_the_send_order():
    lim = RateLimiter(tokens_per_minute=6000)
    assert lim.acquire(5) == Ticket(0, 0, 5)
    assert lim.acquire(7) == Ticket(1, 5, 7)


# ---------------------------------------------------------------------------- config


def fake_server_config(**model):
    return {
        "name": "rl",
        "dataset": {"name": "niah", "params": {}},
        "strategies": ["closed_book"],
        "model": {
            "backend": "openai",
            "name": "m",
            "params": {"base_url": "http://127.0.0.1:9/v1"},
            **model,
        },
    }


def test_rate_limit_is_config_not_identity():
    limited = load_config(fake_server_config(rate_limit={"requests_per_minute": 600}))
    assert limited.model.backend_options() == {"rate_limit": {"requests_per_minute": 600.0}}
    # it changes speed, not answers: the same run folder
    assert config_hash(limited) == config_hash(load_config(fake_server_config()))
    with pytest.raises(ConfigError, match="requests_per_minut"):
        load_config(fake_server_config(rate_limit={"requests_per_minut": 600}))
    with pytest.raises(ConfigError, match="greater than 0"):
        load_config(fake_server_config(rate_limit={"tokens_per_minute": 0}))


def test_rate_limit_on_a_backend_that_sends_nothing_is_refused():
    cfg = fake_server_config(rate_limit={"requests_per_minute": 60})
    cfg["model"] = {"backend": "fake", "name": "fake", "rate_limit": {"requests_per_minute": 60}}
    with pytest.raises(ConfigError, match="backend 'fake' sends no requests.*openai"):
        load_config(cfg)


# ---------------------------------------------------------------------------- a real server


def rate_limited(reset: str = "1s"):
    """A 429 as OpenAI sends it: no Retry-After, the exhausted window and when it resets."""
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": reset,
    }
    return lambda h, body, n: send_json(
        h, 429, {"error": {"message": "Rate limit reached", "code": 429}}, headers
    )


def test_a_429_with_headers_is_retried_after_the_stated_reset(serve):
    srv = serve(sequence(rate_limited("1s"), ok()))
    clock = Clock()
    retry_waits: list[float] = []
    lim = RateLimiter(clock=clock.now, sleep=clock.sleep)
    llm = client(srv, stream=False, sleep=retry_waits.append, rate_limit=lim)
    out = llm.generate([GenerationRequest(prompt="hello")])[0]
    assert out.text == "echo hello"
    assert out.meta["attempts"] == 2
    assert len(srv.requests) == 2
    assert retry_waits == [pytest.approx(1.0)]  # the reset header, not the exponential backoff
    # the others would wait for it too; this thread waited in its retry, the limiter only adds
    # the margin it keeps for the server's clock
    assert lim.pauses == 1 and sum(clock.sleeps) == pytest.approx(RESET_MARGIN)


def test_a_batch_meeting_429s_loses_nothing(serve):
    # the first two answers are 429s: every request still ends with its completion, each sent
    # once more at most
    srv = serve(sequence(rate_limited("6m0s"), rate_limited("20ms"), ok()))
    retry_waits: list[float] = []
    llm = client(
        srv,
        stream=True,
        max_concurrency=1,
        sleep=retry_waits.append,
        rate_limit=RateLimiter(sleep=lambda s: None),
    )
    prompts = [f"q{i}" for i in range(6)]
    outs = llm.generate([GenerationRequest(prompt=p) for p in prompts])
    assert [o.text for o in outs] == [f"echo {p}" for p in prompts]
    assert len(srv.requests) == 8
    # 6m0s is capped at backoff_max (30 s); 20ms is waited as given
    assert retry_waits == [pytest.approx(30.0), pytest.approx(0.02)]


def test_model_rate_limit_reaches_the_backend():
    cfg = load_config(fake_server_config(rate_limit={"tokens_per_minute": 90000}, cache=False))
    llm = load_model(cfg.model)
    assert (llm.limiter.requests_per_minute, llm.limiter.tokens_per_minute) == (None, 90000)
    llm.close()


def test_a_long_retry_after_pauses_the_others_at_most_max_pause_and_says_so(caplog):
    clock = Clock()
    lim = RateLimiter(clock=clock.now, sleep=clock.sleep, max_pause=30.0)
    t = lim.acquire()
    with caplog.at_level(logging.WARNING, logger="ragbench.llm.rate_limit"):
        lim.observe(t, 429, {}, 3600.0)
        lim.observe(lim.acquire(), 429, {}, 3600.0)  # the same pause again: no second line
    other = threading.Thread(target=lim.acquire)
    other.start()
    other.join()
    assert sum(clock.sleeps) == pytest.approx(30.0)  # not the hour
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "server asked to pause 3600 s (capped at 30 s)" in lines[0]


def test_an_exhausted_window_with_a_distant_reset_waits_at_most_max_pause(caplog):
    clock = Clock()
    lim = RateLimiter(clock=clock.now, sleep=clock.sleep, max_pause=30.0)
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "59m"}
    with caplog.at_level(logging.WARNING, logger="ragbench.llm.rate_limit"):
        lim.observe(lim.acquire(), 200, headers, None)
        lim.acquire()
    assert sum(clock.sleeps) == pytest.approx(30.0 + RESET_MARGIN)  # not 59 minutes
    (line,) = [r.getMessage() for r in caplog.records]
    assert "server asked to pause 3540 s (capped at 30 s)" in line


def test_the_backend_caps_the_shared_pause_as_it_caps_a_retry(serve):
    srv = serve(sequence(status(429, "slow down", {"Retry-After": "3600"}), ok()))
    retry_waits: list[float] = []
    lim_waits: list[float] = []
    llm = client(srv, stream=False, backoff_max=2.0, max_concurrency=1, sleep=retry_waits.append)
    llm.limiter.sleep = lim_waits.append
    outs = llm.generate([GenerationRequest(prompt=f"q{i}") for i in range(3)])
    assert [o.text for o in outs] == ["echo q0", "echo q1", "echo q2"]
    assert retry_waits == [pytest.approx(2.0)]
    assert lim_waits and all(w <= 2.0 + RESET_MARGIN for w in lim_waits)  # not the hour
    assert llm.limiter.max_pause == 2.0
