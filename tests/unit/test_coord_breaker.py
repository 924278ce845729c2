"""Circuit breaker: open after N failures, backoff doubling to a cap, one half-open probe."""

from __future__ import annotations

from coordinator.breaker import Breakers, BreakerState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(clock: Clock, changes: list[tuple[str, BreakerState]] | None = None) -> Breakers:
    def note(k: str, s: BreakerState) -> None:
        if changes is not None:
            changes.append((k, s))

    return Breakers(failures=3, backoff_initial=30, backoff_max=300, clock=clock, on_change=note)


def test_opens_after_threshold_and_success_resets_count() -> None:
    c = Clock()
    b = make(c)
    b.failure("e")
    b.failure("e")
    b.success("e")
    b.failure("e")
    b.failure("e")
    assert not b.is_open("e")
    b.failure("e")
    assert b.is_open("e")
    assert b.state("e") == BreakerState.OPEN


def test_half_open_allows_one_probe_then_closes_on_success() -> None:
    c = Clock()
    changes: list[tuple[str, BreakerState]] = []
    b = make(c, changes)
    for _ in range(3):
        b.failure("e")
    c.t += 29.9
    assert b.is_open("e")
    c.t += 0.2
    assert b.state("e") == BreakerState.HALF_OPEN
    assert not b.is_open("e")
    b.on_attempt("e")
    assert b.is_open("e")  # the probe is out: nobody else goes there
    b.success("e")
    assert not b.is_open("e") and b.state("e") == BreakerState.CLOSED
    assert changes == [("e", BreakerState.OPEN), ("e", BreakerState.CLOSED)]


def test_failed_probes_double_backoff_up_to_cap() -> None:
    c = Clock()
    b = make(c)
    for _ in range(3):
        b.failure("e")
    waits = []
    backoff = 30.0
    for _ in range(6):
        c.t += backoff
        b.on_attempt("e")
        b.failure("e")
        backoff = min(backoff * 2, 300)
        waits.append(backoff)
        c.t += backoff - 0.01
        assert b.is_open("e")
        c.t += 0.01
    assert waits == [60, 120, 240, 300, 300, 300]


def test_prefill_and_decode_are_counted_apart() -> None:
    c = Clock()
    b = make(c)
    for _ in range(3):
        b.failure("p-node/0")
    b.failure("d-node/0")
    assert b.is_open("p-node/0")
    assert not b.is_open("d-node/0")


def test_released_probe_lets_another_request_probe() -> None:
    c = Clock()
    b = make(c)
    for _ in range(3):
        b.failure("e")
    c.t += 31
    b.on_attempt("e")
    assert b.is_open("e")
    b.release_probe("e")
    assert not b.is_open("e")
