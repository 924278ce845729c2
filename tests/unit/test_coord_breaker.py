"""Circuit breaker: open after N failures, backoff doubling to a cap, one half-open probe."""

from __future__ import annotations

from coordinator.breaker import Breakers, BreakerState, CircuitChange


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(clock: Clock, changes: list[tuple[str, BreakerState]] | None = None) -> Breakers:
    def note(c: CircuitChange) -> None:
        if changes is not None:
            changes.append((c.key, c.state))

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


def test_a_new_incarnation_closes_an_open_circuit_at_once() -> None:
    """Regression: a decode restarted as a new process stayed unroutable for the old one's
    whole backoff (30 s of 503 after a kill -9)."""
    c = Clock()
    heard: list[CircuitChange] = []
    b = Breakers(failures=3, backoff_initial=30, backoff_max=300, clock=c, on_change=heard.append)
    for _ in range(3):
        b.failure("d", "transport: engine closed the connection")
    assert b.is_open("d") and not b.idle()
    assert heard[-1] == CircuitChange(
        "d", BreakerState.OPEN, "transport: engine closed the connection", failures=3, backoff=30
    )
    c.t += 1  # well inside the backoff
    b.reset("d", "new incarnation (pid 42)")
    assert not b.is_open("d") and b.idle() and b.state("d") == BreakerState.CLOSED
    assert heard[-1] == CircuitChange("d", BreakerState.CLOSED, "new incarnation (pid 42)")
    # The new process starts with a clean count: one failure does not reopen it.
    b.failure("d")
    assert not b.is_open("d")


def test_reset_of_a_closed_circuit_says_nothing() -> None:
    c = Clock()
    changes: list[tuple[str, BreakerState]] = []
    b = make(c, changes)
    b.reset("never-failed", "new incarnation")
    b.failure("e")
    b.reset("e", "new incarnation")  # counted failures, never opened: forgotten silently
    b.failure("e")
    b.failure("e")
    assert not b.is_open("e") and changes == []


def test_idle_tracks_open_circuits() -> None:
    c = Clock()
    b = make(c)
    assert b.idle()
    for _ in range(3):
        b.failure("e")
    assert not b.idle()
    c.t += 31
    b.on_attempt("e")  # the probe
    assert not b.idle()
    b.success("e")
    assert b.idle()
