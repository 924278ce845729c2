"""Circuit breakers per endpoint: open after N failures in a row, back off, probe, close.

An endpoint serves one role, so prefill and decode endpoints are counted apart; in a P/D
attempt only the leg that failed is charged. Backoff starts at `backoff_initial` and doubles
on every failed probe up to `backoff_max`; one success closes the circuit and resets it.
While the backoff runs `is_open` is True; when it has run out, one request may probe
(`on_attempt` marks it) and the others wait for the outcome.

A circuit belongs to one incarnation of its endpoint: when the endpoint comes back as a new
process (`reset`, called when the log says READY with another pid) the old process's
failures say nothing about the new one, and routing resumes at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class _Circuit:
    failures: int = 0
    open_until: float = 0.0
    backoff: float = 0.0  # 0: has not opened since the last success
    probing: bool = False


@dataclass(frozen=True, slots=True)
class CircuitChange:
    """What a listener hears when a circuit opens or closes."""

    key: str
    state: BreakerState
    reason: str  # the failure that opened it, or why it closed
    failures: int = 0
    backoff: float = 0.0  # seconds until a probe (open only)


StateListener = Callable[[CircuitChange], None]


class Breakers:
    """Every endpoint's circuit; `is_open` is what the routing table asks."""

    def __init__(
        self,
        *,
        failures: int = 3,
        backoff_initial: float = 30.0,
        backoff_max: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: StateListener | None = None,
    ) -> None:
        self.threshold = failures
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.clock = clock
        self.on_change = on_change
        self._circuits: dict[str, _Circuit] = {}
        self._opened: set[str] = set()  # keys whose circuit has a backoff (open or half-open)

    def state(self, key: str) -> BreakerState:
        """The circuit's state now."""
        c = self._circuits.get(key)
        if c is None or c.backoff == 0.0:
            return BreakerState.CLOSED
        if self.clock() < c.open_until:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def is_open(self, key: str) -> bool:
        """True while the endpoint must not be chosen (backing off, or a probe is out)."""
        if key not in self._opened:
            return False
        c = self._circuits[key]
        return c.probing or self.clock() < c.open_until

    def idle(self) -> bool:
        """True when no circuit is open or half-open (the table may skip its filter)."""
        return not self._opened

    def on_attempt(self, key: str) -> None:
        """A request was sent to the endpoint; in half-open state it is the probe."""
        if key not in self._opened:
            return
        c = self._circuits[key]
        if not c.probing and self.clock() >= c.open_until:
            c.probing = True

    def success(self, key: str) -> None:
        """The endpoint answered: close its circuit."""
        c = self._circuits.pop(key, None)
        if c is not None and c.backoff:
            self._opened.discard(key)
            self._notify(CircuitChange(key, BreakerState.CLOSED, "a request succeeded"))

    def failure(self, key: str, reason: str = "") -> None:
        """The endpoint failed a request (connect error, 5xx, timeout, death mid-stream)."""
        c = self._circuits.get(key)
        if c is None:
            c = self._circuits[key] = _Circuit()
        now = self.clock()
        if c.backoff:
            if c.probing or now >= c.open_until:
                # The probe failed: back off longer.
                c.backoff = min(c.backoff * 2, self.backoff_max)
                c.open_until = now + c.backoff
                c.probing = False
                self._notify(
                    CircuitChange(key, BreakerState.OPEN, f"probe failed: {reason}", c.failures, c.backoff)
                )
            return
        c.failures += 1
        if c.failures >= self.threshold:
            c.backoff = self.backoff_initial
            c.open_until = now + c.backoff
            c.probing = False
            self._opened.add(key)
            self._notify(CircuitChange(key, BreakerState.OPEN, reason, c.failures, c.backoff))

    def reset(self, key: str, reason: str) -> None:
        """Forget the endpoint's circuit (it is another process now): routable at once."""
        c = self._circuits.pop(key, None)
        if c is not None and c.backoff:
            self._opened.discard(key)
            self._notify(CircuitChange(key, BreakerState.CLOSED, reason))

    def release_probe(self, key: str) -> None:
        """A probe ended without a verdict (the client went away): let another one try."""
        c = self._circuits.get(key)
        if c is not None:
            c.probing = False

    def _notify(self, change: CircuitChange) -> None:
        if self.on_change is not None:
            self.on_change(change)
