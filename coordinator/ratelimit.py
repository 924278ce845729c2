"""Admission control: a token bucket (requests per second, burst) and a cap on requests in flight.

The hot path calls `try_acquire()` once per request and `release()` when it ends; a refusal
carries the seconds a client should wait (`Retry-After`). Time comes from an injectable
monotonic clock so tests need no sleeping.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.coordconfig import RateLimitConfig


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused and when to come back."""

    reason: str  # "rate" | "in_flight"
    retry_after: float  # seconds

    @property
    def header(self) -> str:
        """`Retry-After` value: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after)))

    @property
    def message(self) -> str:
        """Client-facing text of the 429."""
        if self.reason == "rate":
            return f"rate limit exceeded; retry after {self.header} s"
        return f"too many requests in flight; retry after {self.header} s"


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; one token a request."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.burst = max(1.0, burst)
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()

    def take(self) -> float:
        """0.0 when a token was taken, else the seconds until one is available."""
        now = self._clock()
        tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return 0.0
        self._tokens = tokens
        return (1.0 - tokens) / self.rate


class RateLimiter:
    """Token bucket plus max in-flight, from `coordinator.rate_limit` (0 disables either)."""

    def __init__(self, cfg: RateLimitConfig, clock: Callable[[], float] = time.monotonic) -> None:
        rps = cfg.requests_per_second
        self.bucket = TokenBucket(rps, cfg.burst or rps, clock) if rps > 0 else None
        self.max_in_flight = cfg.max_in_flight
        self.in_flight = 0
        # Retry-After for a full house: we cannot know when a slot frees, one second is honest.
        self.in_flight_retry = 1.0

    @property
    def enabled(self) -> bool:
        """Whether any limit is configured."""
        return self.bucket is not None or self.max_in_flight > 0

    def try_acquire(self) -> Refusal | None:
        """Admit a request (then `release()` it when done) or say why not."""
        if self.max_in_flight and self.in_flight >= self.max_in_flight:
            return Refusal("in_flight", self.in_flight_retry)
        if self.bucket is not None:
            wait = self.bucket.take()
            if wait > 0:
                return Refusal("rate", wait)
        self.in_flight += 1
        return None

    def release(self) -> None:
        """A request admitted by `try_acquire` ended."""
        if self.in_flight > 0:
            self.in_flight -= 1
