"""Admission control: token bucket and max in-flight, with a fake clock."""

from __future__ import annotations

import pytest

from coordinator.ratelimit import RateLimiter, TokenBucket
from core.coordconfig import RateLimitConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_disabled_by_default_admits_everything() -> None:
    rl = RateLimiter(RateLimitConfig())
    assert not rl.enabled
    assert all(rl.try_acquire() is None for _ in range(1000))


def test_bucket_allows_the_burst_then_refuses_with_the_wait() -> None:
    clock = Clock()
    b = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [b.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take() == pytest.approx(0.5)
    clock.now += 0.5
    assert b.take() == 0.0
    clock.now += 100  # refills only up to the burst
    assert [b.take() for _ in range(4)][-1] > 0


def test_rate_refusal_says_rate_and_retry_after_whole_seconds() -> None:
    clock = Clock()
    rl = RateLimiter(RateLimitConfig(requests_per_second=0.25, burst=1), clock)
    assert rl.try_acquire() is None
    refusal = rl.try_acquire()
    assert refusal is not None
    assert (refusal.reason, refusal.retry_after, refusal.header) == ("rate", 4.0, "4")
    assert "rate limit" in refusal.message
    clock.now += 4
    assert rl.try_acquire() is None


def test_burst_defaults_to_the_rate() -> None:
    rl = RateLimiter(RateLimitConfig(requests_per_second=5), Clock())
    assert sum(rl.try_acquire() is None for _ in range(10)) == 5


def test_max_in_flight_counts_until_release() -> None:
    rl = RateLimiter(RateLimitConfig(max_in_flight=2), Clock())
    assert rl.try_acquire() is None and rl.try_acquire() is None
    refusal = rl.try_acquire()
    assert refusal is not None and refusal.reason == "in_flight" and refusal.header == "1"
    rl.release()
    assert rl.try_acquire() is None
    assert rl.in_flight == 2


def test_in_flight_refusal_does_not_spend_a_token() -> None:
    clock = Clock()
    rl = RateLimiter(RateLimitConfig(requests_per_second=1, burst=1, max_in_flight=1), clock)
    assert rl.try_acquire() is None
    assert rl.try_acquire() is not None  # in flight: full
    rl.release()
    clock.now += 1
    assert rl.try_acquire() is None


def test_sub_second_wait_still_says_one_second() -> None:
    rl = RateLimiter(RateLimitConfig(requests_per_second=100, burst=1), Clock())
    rl.try_acquire()
    refusal = rl.try_acquire()
    assert refusal is not None and refusal.retry_after < 0.1 and refusal.header == "1"
