"""The coordinator in the simulation: its table fold and its routing, on the same memory log.

A `SimCoordinator` runs what a replica runs to choose where a request goes — the log folded into
`coordinator.table.RoutingTable` through `coordinator.feed.follow_log`, `coordinator.choose.Chooser`
with the configured policies, `coordinator.breaker.Breakers` wired into the table as
`coordinator.service.build_proxy` wires them (a circuit per engine incarnation) — and, instead
of the HTTP proxy, a seeded stream of requests: each is routed, and what it finds at the
chosen engines (answering or not, the simulated machine's truth) is told to the breaker as a
proxied request's outcome would be. What each route was is kept for the routing invariants.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.breaker import Breakers
from coordinator.choose import Chooser
from coordinator.context import CoordinatorContext
from coordinator.endpoint import Endpoint, Incarnation
from coordinator.feed import follow_log
from coordinator.policies import RequestInfo
from coordinator.service import make_policies
from streams.livefold import LiveFold
from streams.memory import MemoryLog
from tests.sim.procs import SimProcess

if TYPE_CHECKING:
    from tests.sim.world import World


@dataclass(frozen=True, slots=True)
class Routed:
    """One simulated request: when, where it went, and whether the engines answered."""

    at: float  # loop time
    keys: tuple[str, ...]  # the endpoints of its last route, the client-facing one first (none: no route)
    ok: bool
    unroutable: tuple[str, ...] = ()  # chosen although the table or its breaker excluded them
    retried: int = 0  # attempts that failed before the last


@dataclass
class RoutingLog:
    """Every request of the run."""

    requests: list[Routed] = field(default_factory=list)


class SimCoordinator(SimProcess):
    """One coordinator replica (stateless: a restart folds the log again)."""

    kind = "coordinator"

    def __init__(self, world: World, name: str = "coordinator/sim") -> None:
        super().__init__(world, name)
        self.ctx: CoordinatorContext | None = None
        self.router: Chooser | None = None
        self.breakers: Breakers | None = None
        self.routing = RoutingLog()
        self._fold: LiveFold | None = None
        models = {
            s.model for role in ("union", "prefill", "decode") if (s := getattr(world.cfg, role)) is not None
        }
        self.models = sorted(models)

    def fold(self) -> LiveFold | None:
        return self._fold

    def start(self) -> None:
        log = self._begin()
        self.stop = asyncio.Event()
        assert self.proc is not None
        self.task = self.world.loop.spawn(self.proc, self._run(log), name=self.proc.name)

    async def _run(self, log: MemoryLog) -> None:
        w = self.world
        s = w.cfg.coordinator
        ctx = self.ctx = CoordinatorContext(settings=s, source=f"{self.name}")
        breakers = self.breakers = Breakers(
            failures=s.breaker.failures,
            backoff_initial=s.breaker.backoff_initial,
            backoff_max=s.breaker.backoff_max,
            clock=w.loop.time,
        )
        table = ctx.table
        table.is_open = breakers.is_open
        table.breaker_idle = breakers.idle

        def on_incarnation(key: str, inc: Incarnation) -> None:
            breakers.reset(key, f"new incarnation ({inc.describe()})")

        table.on_incarnation = on_incarnation
        self.router = Chooser(table, make_policies(s))
        self._fold = follow_log(ctx, log, name=self.name, clock=w.loop.wall)
        await self._fold.start()
        rng = w.rng_for(f"requests/{self.incarnation}")
        n = 0
        while True:
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            if not (ctx.caught_up.is_set() or self._fold.caught_up_once):
                continue  # not ready: the replica answers 503 until it holds the log
            n += 1
            self.request(self.models[n % len(self.models)], n, rng.randbytes(8))

    def request(self, model: str, n: int, prefix: bytes) -> None:
        """Route one request and play it against the engines its route names; a failed attempt
        is tried again on another path, the endpoint that failed it excluded, `retries` times
        (as `coordinator/proxy/attempts.py` does)."""
        assert self.ctx is not None and self.router is not None and self.breakers is not None
        table, breakers = self.ctx.table, self.breakers
        now = self.world.loop.time()
        info = RequestInfo(model, prefix, f"sim-{n}")
        failed: list[str] = []
        keys: tuple[str, ...] = ()
        excluded: tuple[str, ...] = ()
        for _ in range(1 + self.world.cfg.coordinator.retries):
            route = self.router.choose(table.plan(model), info, exclude=failed)
            if route is None:
                break
            legs: list[Endpoint] = [route.ep] + ([route.prefill] if route.prefill is not None else [])
            keys = tuple(e.key for e in legs)
            routable = {e.key for e in table.routable()}
            excluded += tuple(e.key for e in legs if e.key not in routable or breakers.is_open(e.key))
            bad = self._attempt(legs)
            if bad is None:
                self.routing.requests.append(Routed(now, keys, True, excluded, len(failed)))
                return
            failed.append(bad)
        self.routing.requests.append(Routed(now, keys, False, excluded, len(failed)))

    def _attempt(self, legs: list[Endpoint]) -> str | None:
        """Play one attempt; the key of the endpoint that failed it, or None."""
        assert self.breakers is not None
        for ep in reversed(legs):  # the prefill leg first, as the adapters run it
            self.breakers.on_attempt(ep.key)
            if self.world.serving(ep.key.rpartition("/")[0], ep.port):
                self.breakers.success(ep.key)
            else:
                self.breakers.failure(ep.key, "the engine did not answer")
                return ep.key
        return None
