"""Hedging: a request whose engine is slow to send its first byte is sent on another path as
well, and the first to answer is the client's.

The stall detector does not wait for the health check: an attempt with no first byte after
`factor` × its endpoint's recent time to first byte (at least `min_delay`, at most the
first-token timeout; half that timeout for an endpoint with no history yet) starts a second
attempt on a candidate that excludes the first's endpoints. Both race for the delivery:
the first whose client-facing leg has its answer claims it (`Race.claim`), and the other is
stopped — cancelled when the hedge lost, its exchanges ended (`Exchanges.lose`) when the
first attempt did. The request's task waits for the hedge when its own attempt lost or
failed, so the attempt loop sees one outcome per candidate, as without a hedge.

Deadlines are a table swept a few times a second (a timer handle per request costs more than
the routing decision); an attempt leaves it when it claims or ends. Hedges in flight are
capped at `max_fraction` of the attempts waiting (at least two), so a fleet slow everywhere is
not doubled in load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from coordinator.endpoint import Candidate, Endpoint
from coordinator.metrics import CoordinatorMetrics
from core.coordconfig import HedgeConfig

log = logging.getLogger(__name__)

SWEEP = 0.05  # seconds between looks at the deadlines
EWMA = 0.2  # weight of the newest time to first byte in an endpoint's recent one


class Attempt(Protocol):
    """What hedging needs of an attempt (`coordinator.proxy.legs.Attempt`)."""

    rid: str  # its engine request id: each attempt has its own
    t0: float  # when it began (the hedger's clock)
    hedger: Hedger | None
    race: Race | None


class Race:
    """A request's attempt and its hedge, racing for the delivery."""

    __slots__ = ("first", "hedge", "task", "winner")

    def __init__(self, first: Attempt, hedge: Attempt) -> None:
        self.first = first
        self.hedge = hedge
        self.task: asyncio.Task[None] | None = None  # the hedge's, run beside the request's own
        self.winner: Attempt | None = None


# Makes the hedge of a watched attempt: the attempt that races and its candidate (None when
# no other candidate is left), and serves one (the attempt loop's).
Starter = Callable[[Any], "tuple[Any, Candidate] | None"]
Runner = Callable[[Any, Candidate], Coroutine[Any, Any, None]]


class Hedger:
    """The hedge deadlines of every attempt waiting for its first byte, and the races."""

    def __init__(
        self,
        cfg: HedgeConfig,
        first_token_timeout: float,
        *,
        lose: Callable[[str], int],
        metrics: CoordinatorMetrics | None = None,
        clock: Callable[[], float] = time.perf_counter,  # an attempt's `t0` is on it
    ) -> None:
        self.cfg = cfg
        self.lose = lose  # ends every exchange of an attempt (`Exchanges.lose`)
        self.first_token_timeout = first_token_timeout
        self.metrics = metrics
        self.clock = clock
        self.due: dict[Attempt, float] = {}  # attempt -> when to hedge it
        self.racing = 0  # hedges under way
        self.start: Starter | None = None  # set by the attempt loop
        self.run: Runner | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    def watch(self, at: Attempt, ep: Endpoint) -> None:
        """Hedge `at` (on candidate endpoint `ep`, begun at `at.t0` on this clock) if it has
        no first byte in time."""
        at.hedger = self
        cfg = self.cfg
        if not cfg.enabled:
            return
        ttft = ep.ttft  # the hedge delay, inline: this is every request's
        delay = cfg.factor * ttft if ttft > 0 else self.first_token_timeout / 2
        if delay < cfg.min_delay:
            delay = cfg.min_delay
        if delay >= self.first_token_timeout:
            return
        self.due[at] = at.t0 + delay
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self._sweep)

    def claim(self, at: Attempt, ep: Endpoint) -> bool:
        """`at`'s client-facing leg (on `ep`) has its answer: whether it is the client's."""
        self.due.pop(at, None)
        took = self.clock() - at.t0
        ep.ttft = (
            took if ep.ttft <= 0 else ep.ttft + EWMA * (took - ep.ttft)
        )  # its recent time to first byte (EWMA)
        race = at.race
        if race is None:
            return True
        if race.winner is not None:
            return race.winner is at
        race.winner = at
        self.racing -= 1
        if self.metrics is not None:
            self.metrics.hedges.labels(winner="hedge" if at is race.hedge else "first").inc()
        if at is race.hedge:
            lost = race.first
            self.due.pop(lost, None)
            self.lose(lost.rid)
            log.info("%s: the hedge on %s answered first", at.rid, ep.key)
        elif race.task is not None:
            race.task.cancel()  # its exchanges close on the way out: the engines abort it
        return True

    def ended(self, at: Attempt) -> None:
        """`at` ended (it claimed, failed or was cancelled)."""
        race = at.race
        if race is None:
            if at in self.due:  # it failed before its first byte (a claim took it out)
                del self.due[at]
            return
        self.due.pop(at, None)
        if race.winner is None and at is race.hedge:
            race.winner = race.first  # the hedge failed first: the first attempt goes on alone
            self.racing -= 1

    def _sweep(self) -> None:
        now = self.clock()
        cap = max(2, int(self.cfg.max_fraction * len(self.due)))
        late = [at for at, when in self.due.items() if when <= now and at.race is None]
        start, run = self.start, self.run
        assert start is not None and run is not None
        for at in late:
            del self.due[at]
            if self.racing >= cap:
                continue
            made = start(at)
            if made is None:
                continue
            hedge, cand = made
            race = at.race = hedge.race = Race(at, hedge)
            hedge.t0 = now
            hedge.hedger = self
            self.racing += 1
            log.info("%s: no first byte within its hedge delay; hedged as %s on %r", at.rid, hedge.rid, cand)
            race.task = asyncio.get_running_loop().create_task(run(hedge, cand))
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self._sweep) if self.due else None
