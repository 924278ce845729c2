"""One chaos scenario's bookkeeping: baseline, traffic, the checks every scenario makes, report.

A scenario test reads: start traffic, inject one fault, wait for the cluster to re-converge
(measured), stop traffic, then check the invariants that apply and `finish()`, which prints
the table and fails on any FAIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from core.events import Role
from tests.chaos import invariants as inv
from tests.chaos.faults import signal_pid, sleep_until
from tests.chaos.fleet import Engine, engines, pid_on, running, served
from tests.chaos.harness import ChaosCluster
from tests.chaos.load import LoadGen

CONVERGE_WITHIN = 30.0  # invariant 8
RESUME_WITHIN = 10.0  # invariant 2: a READY endpoint serves again this soon
FAILOVER_WITHIN = 3.0  # invariant 9


class Scenario:
    """What one scenario did and found (on a `ChaosCluster`, or tests/multihost's `MultiHost`,
    which observes a cluster on several hosts through the same methods)."""

    def __init__(self, cc: ChaosCluster, title: str) -> None:
        self.cc = cc
        self.title = title
        self.checks: list[inv.Check] = []
        self.procs0 = cc.snapshot_procs()
        self.began = time.time()
        self.seq0 = 0
        self.load: LoadGen | None = None
        self.fault_at = 0.0  # when the (first) fault took effect: times in details are relative to it

    @classmethod
    async def begin(cls, cc: ChaosCluster, title: str) -> Scenario:
        sc = cls(cc, title)
        sc.seq0 = await cc.last_seq()
        print(f"\n-- {title}: cluster {cc.generation}, log at seq {sc.seq0}", flush=True)
        return sc

    @contextlib.asynccontextmanager
    async def traffic(
        self, *, clients: int = 6, retry_connection_errors: bool = False
    ) -> AsyncIterator[LoadGen]:
        """Client traffic for the body (and a second of it before the fault)."""
        load = LoadGen(
            self.cc.base_url,
            clients=clients,
            retry_connection_errors=retry_connection_errors,
            timeout=self.cc.client_timeout,
        )
        self.load = load
        async with load:
            await asyncio.sleep(1.5)
            yield load

    def fault(self, at: float) -> float:
        """Note when the fault took effect (the first one, if several)."""
        if not self.fault_at:
            self.fault_at = at
            print(f"   fault at +{at - self.began:.1f} s", flush=True)
        return at

    def check(self, c: inv.Check) -> None:
        self.checks.append(c)
        print(f"   {'PASS' if c.ok else 'FAIL'} {c.invariant}: {c.detail}", flush=True)

    async def entries(self) -> list[inv.Entry]:
        """The log since the scenario began (all of it once the stream started again from 1)."""
        last = await self.cc.last_seq()
        return await self.cc.entries(self.seq0 + 1 if 0 < self.seq0 <= last else 0)

    async def converge(self, since: float, *, floor: float = 3.0) -> tuple[float | None, str]:
        """Seconds from the end of the fault to every instance ACTIVE and routed to.

        Traffic runs at least `floor` s past the fault first, so what the fault set off (a
        restarted process re-asserting itself) happens while clients are watching.
        """
        await sleep_until(since + floor)
        return await self.cc.converge(since, CONVERGE_WITHIN, self.load)

    async def common(
        self,
        *,
        fault_ended: float,
        killed: tuple[str, ...] = (),
        nats_trouble: bool = False,
        reconnect_until: float | None = None,
        stuck_after: float | None = None,
        stuck_limit: float = 0.0,
        took: tuple[float | None, str] | None = None,
    ) -> list[inv.Entry]:
        """Invariants 8, 1, 3 and 6 (every scenario); returns the log since the scenario began.

        `took` is what `converge` measured when the scenario did so itself (else it is done here).
        """
        seconds, why = took if took is not None else await self.converge(fault_ended)
        self.check(inv.reconverged(seconds, CONVERGE_WITHIN, "every instance ACTIVE and routed to", why))
        if self.load is not None:
            await self.load.stop()
            self.check(
                inv.client_outcomes(
                    self.load.outcomes,
                    self.cc.refs,
                    reconnect_until=reconnect_until,
                    stuck_after=stuck_after,
                    stuck_limit=stuck_limit,
                    origin=self.fault_at or self.began,
                )
            )
        self.check(inv.processes(self.cc.procs_since(self.procs0), killed=killed, nats_trouble=nats_trouble))
        entries = await self.entries()
        self.check(inv.one_start_per_incarnation(entries))
        return entries

    async def explain(self, entries: list[inv.Entry], since: float, instance_id: int) -> None:
        """Invariant 10: the coordinator's side of the fault is in the log and in --explain."""
        out = await self.cc.motor("replay", "--explain", "instance", str(instance_id))
        self.check(inv.explained(entries, since, out.stdout + out.stderr))

    def finish(self) -> None:
        """Print the scenario's table; fail on any invariant that does not hold."""
        table = inv.report(self.title, self.checks)
        print(table, flush=True)
        failed = [c for c in self.checks if not c.ok]
        if failed:
            raise AssertionError(
                f"{len(failed)} invariant(s) failed in '{self.title}':\n"
                + "\n".join(f"  {c.invariant}: {c.detail}" for c in failed)
            )


# --------------------------------------------------------------------------- engine faults


@dataclass
class EngineHit:
    """An engine the scenario hit, and what became of it."""

    engine: Engine
    pid: int
    at: float
    in_flight: int
    served_at: float | None = None
    _task: asyncio.Task[None] | None = None

    def watch_served(self) -> None:
        """Note when a new process on the same port first serves a request."""

        async def run() -> None:
            while True:
                pid = pid_on(self.engine.port)
                if pid is not None and pid != self.pid and await served(self.engine.port) > 0:
                    self.served_at = time.time()
                    return
                await asyncio.sleep(0.25)

        self._task = asyncio.create_task(run(), name=f"served-{self.engine.port}")

    def stop_watching(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def ready_at(self, entries: list[inv.Entry]) -> float | None:
        """When its endpoint reported READY after the hit (the new process)."""
        for e in entries:
            if (
                e.type == "endpoint.status_changed"
                and e.data.get("node_id") == self.engine.node_id
                and e.data.get("status") == "READY"
                and e.ts >= self.at
            ):
                return e.ts
        return None


async def engine_of(cc: ChaosCluster, role: Role) -> Engine:
    state = await cc.wait_until(
        f"an ACTIVE {role.value} instance", lambda s: any(e.role == role for e in engines(s)), 30
    )
    return next(e for e in engines(state) if e.role == role)


async def hit_engine(
    cc: ChaosCluster, role: Role, sig: int = signal.SIGKILL, *, wait_streams: float = 8.0
) -> EngineHit:
    """Signal the `role` engine while it runs requests (waits up to `wait_streams` for some)."""
    eng = await engine_of(cc, role)
    pid = pid_on(eng.port)
    assert pid is not None, f"no process serves {eng.label}"
    deadline = time.monotonic() + wait_streams
    busy = await running(eng.port)
    while busy < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        busy = await running(eng.port)
    hit = EngineHit(eng, pid, signal_pid(pid, sig), busy)
    print(f"   {signal.Signals(sig).name} {eng.label} pid {pid} with {busy} request(s) running", flush=True)
    if sig == signal.SIGKILL:
        hit.watch_served()
    return hit


async def until_restarted(cc: ChaosCluster, name: str, before: int, within: float = 30.0) -> bool:
    """Wait until the supervisor restarted `name` (its restart count passed `before`)."""
    deadline = time.monotonic() + within
    while cc.cluster.restarts(name) <= before:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def resumed(hits: list[EngineHit], entries: list[inv.Entry]) -> inv.Check:
    """Invariant 2 over every engine a scenario killed."""
    for h in hits:
        h.stop_watching()
    return inv.routing_resumed(
        {h.engine.label: (h.ready_at(entries), h.served_at) for h in hits}, RESUME_WITHIN
    )
