"""Simulated engines behind the node agent's `nodeagent.host.EngineHost` seam.

A `Machine` is one node's host: it outlives its node agent (a crashed agent's engines keep
running, and the next agent adopts them by pid from its run-state file, as on a real machine).
An engine loads for a while (health checks fail with 503, the agent keeps it STARTING), then
answers; the fault schedule can kill it (SIGKILL: it exits -9) or hang it (every question
times out, SIGTERM is ignored, SIGKILL still works), for a while or for good. Questions take a
little virtual time, as a request on localhost does; a hung engine's take their whole timeout.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.config import HealthCheckConfig
from nodeagent.errors import CommandRefusal
from nodeagent.loadmetrics import Load
from nodeagent.supervisor import Exit, describe_exit

SIGKILL = -9
SIGTERM = -15
HTTP_RTT = 0.0005  # a local request's round trip


class Engine:
    """One engine process on a machine."""

    def __init__(
        self, machine: Machine, pid: int, port: int, argv: tuple[str, ...], loads_for: float
    ) -> None:
        self.machine = machine
        self.pid = pid
        self.port = port
        self.argv = argv
        loop = asyncio.get_running_loop()
        self.started = loop.time()
        self.ready_at = self.started + loads_for
        self.hung_until = 0.0  # loop time; inf: for good
        self.exit: asyncio.Future[int] = loop.create_future()
        self.exit.add_done_callback(lambda _: None)  # nobody may be waiting: not an error
        self.running = 0  # requests the simulated clients have on it

    @property
    def alive(self) -> bool:
        return not self.exit.done()

    @property
    def hung(self) -> bool:
        return self.alive and asyncio.get_running_loop().time() < self.hung_until

    @property
    def serving(self) -> bool:
        """Alive, loaded and not hung: what a request would find answering."""
        return self.alive and not self.hung and asyncio.get_running_loop().time() >= self.ready_at

    def kill(self, code: int = SIGKILL) -> None:
        if self.alive:
            self.exit.set_result(code)
            self.machine.exits.append((asyncio.get_running_loop().time(), self.pid, code))

    def hang(self, seconds: float) -> None:
        self.hung_until = asyncio.get_running_loop().time() + seconds


class Handle:
    """What the node agent holds of an engine (`nodeagent.host.EngineProc`)."""

    def __init__(self, engine: Engine, adopted: bool) -> None:
        self.engine = engine
        self.pid = engine.pid
        self.start_time: int | None = engine.pid  # unique per process, as /proc's start time is
        self._adopted = adopted

    @property
    def adopted(self) -> bool:
        return self._adopted

    @property
    def exited(self) -> bool:
        return not self.engine.alive

    async def wait(self) -> Exit:
        code = await asyncio.shield(self.engine.exit)
        known = None if self._adopted else code  # not our child: its exit code is unknown
        return Exit(known, describe_exit(known))

    async def stop(self, grace: float) -> Exit:
        e = self.engine
        if e.alive and not e.hung:
            await asyncio.sleep(HTTP_RTT)  # a clean shutdown takes a moment
            e.kill(SIGTERM)
        elif e.alive:  # hung: SIGTERM is ignored, SIGKILL after the grace
            await asyncio.sleep(grace)
            e.kill(SIGKILL)
        return await self.wait()

    async def close(self) -> None:
        pass


class Machine:
    """One node's host: its engines by port, and what happened to them."""

    def __init__(self, name: str, rng: random.Random, pids: list[int]) -> None:
        self.name = name
        self.rng = rng
        self._pids = pids  # shared by every machine: pids are unique in the world
        self.engines: dict[int, Engine] = {}  # by pid, alive or not
        self.exits: list[tuple[float, int, int]] = []  # (loop time, pid, code)

    def by_port(self, port: int) -> Engine | None:
        for e in reversed(list(self.engines.values())):
            if e.port == port and e.alive:
                return e
        return None

    def live(self) -> list[Engine]:
        return [e for e in self.engines.values() if e.alive]

    # ------------------------------------------------------------------ EngineHost

    def port_free(self, host: str, port: int) -> bool:
        return self.by_port(port) is None

    async def spawn(self, argv: tuple[str, ...], env: Mapping[str, str], log_path: Path) -> Handle:
        try:
            port = int(argv[argv.index("--port") + 1])
        except (ValueError, IndexError):
            raise CommandRefusal("spawn_failed", f"no --port in {' '.join(argv)}") from None
        await asyncio.sleep(0.001)  # fork and exec
        self._pids[0] += 1
        e = Engine(self, self._pids[0], port, argv, loads_for=self.rng.uniform(0.5, 3.0))
        self.engines[e.pid] = e
        return Handle(e, adopted=False)

    def adopt(self, pid: int, start_time: int | None) -> Handle | None:
        e = self.engines.get(pid)
        if e is None or not e.alive or (start_time is not None and start_time != e.pid):
            return None
        return Handle(e, adopted=True)

    def _engine(self, url: str) -> Engine | None:
        port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        return self.by_port(port)

    async def _answers(self, e: Engine, within: float) -> bool:
        """Wait for a (possibly hung) engine to answer; False when it did not within `within`."""
        await asyncio.sleep(HTTP_RTT)
        if e.hung:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(min(within, e.hung_until - loop.time()))
            return not e.hung and e.alive
        return e.alive

    async def health(self, url: str, cfg: HealthCheckConfig) -> tuple[bool, str]:
        e = self._engine(url)
        if e is None:
            await asyncio.sleep(HTTP_RTT)
            return False, "connection failed (Connection refused)"
        for _ in range(cfg.retry_attempts):  # only a timeout earns another attempt (seed 002)
            if await self._answers(e, cfg.timeout):
                break
            if not e.alive:
                return False, "connection failed (Connection refused)"
        else:
            return False, f"timed out {cfg.retry_attempts} times ({cfg.timeout:g}s each)"
        if asyncio.get_running_loop().time() < e.ready_at:
            return False, "HTTP 503"
        return True, ""

    async def load(self, url: str, within: float) -> Load | None:
        e = self._engine(url)
        if e is None or not await self._answers(e, within):
            return None
        return Load(running=e.running, waiting=0, kv_usage=min(1.0, e.running / 64))

    async def fault_status(self, url: str, within: float) -> str | None:
        e = self._engine(url)
        if e is None or not await self._answers(e, within):
            return None
        return "healthy"

    async def call(
        self, method: str, url: str, body: dict[str, Any] | None, within: float
    ) -> tuple[int, str]:
        """The simulated engines have no admin routes: a fleet operation is `unsupported` on them."""
        e = self._engine(url)
        if e is None or not await self._answers(e, within):
            raise OSError(f"{url}: no answer")
        return 404, "not found"
