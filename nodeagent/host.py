"""Where a node's engines run: this machine's processes (`ProcessHost`), or simulated ones.

Everything `Engines`, the heartbeats and the fault reporter ask of the machine goes through one
`EngineHost`: whether a port is free, start an engine process, take over one an earlier agent
left running, and three HTTP questions to a running engine (`/health`, `/metrics`,
`/fault_tolerance/status`). Production's is `ProcessHost`, the process supervisor and aiohttp
checks as they were; the seeded simulator (tests/sim) gives engines that live in memory and can
be killed or hung by its fault schedule, so the agent's own logic runs unchanged around them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from core.config import HealthCheckConfig
from nodeagent.ftstatus import poll
from nodeagent.health import check
from nodeagent.loadmetrics import Load, scrape
from nodeagent.supervisor import EngineProcess, Exit, port_free


class EngineProc(Protocol):
    """One engine process as the agent watches it (`nodeagent.supervisor.EngineProcess`)."""

    pid: int
    start_time: int | None

    @property
    def adopted(self) -> bool:
        """Taken over after an agent restart (not our child: its exit code is unknown)."""
        ...

    @property
    def exited(self) -> bool: ...

    async def wait(self) -> Exit:
        """Wait for the process to end."""
        ...

    async def stop(self, grace: float) -> Exit:
        """Stop it (SIGTERM, then SIGKILL after `grace` seconds) and wait for it."""
        ...

    async def close(self) -> None:
        """Stop watching it (the process is left alone)."""
        ...


class EngineHost(Protocol):
    """The machine a node agent runs its engines on."""

    def port_free(self, host: str, port: int) -> bool: ...

    async def spawn(self, argv: tuple[str, ...], env: Mapping[str, str], log_path: Path) -> EngineProc:
        """Start an engine (CommandRefusal `spawn_failed` when it cannot be started)."""
        ...

    def adopt(self, pid: int, start_time: int | None) -> EngineProc | None:
        """The engine an earlier agent started, if that very process still runs."""
        ...

    async def health(self, url: str, cfg: HealthCheckConfig) -> tuple[bool, str]:
        """One health check (seed 002's attempts and timeouts): (healthy, what went wrong)."""
        ...

    async def load(self, url: str, within: float) -> Load | None:
        """The engine's load from its metrics; None when it did not answer in time."""
        ...

    async def fault_status(self, url: str, within: float) -> str | None:
        """What its fault-tolerance endpoint says (healthy, unhealthy, dead); None: no answer."""
        ...

    async def call(
        self, method: str, url: str, body: dict[str, Any] | None, within: float
    ) -> tuple[int, str]:
        """One admin request to an engine (a fleet operation): (HTTP status, body text)."""
        ...


class ProcessHost:
    """This machine: engines are child processes, questions are HTTP requests."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    def port_free(self, host: str, port: int) -> bool:
        return port_free(host, port)

    async def spawn(self, argv: tuple[str, ...], env: Mapping[str, str], log_path: Path) -> EngineProc:
        return await EngineProcess.spawn(argv, env, log_path)

    def adopt(self, pid: int, start_time: int | None) -> EngineProc | None:
        return EngineProcess.adopt(pid, start_time)

    async def health(self, url: str, cfg: HealthCheckConfig) -> tuple[bool, str]:
        return await check(self.session, url, cfg)

    async def load(self, url: str, within: float) -> Load | None:
        return await scrape(self.session, url, within)

    async def fault_status(self, url: str, within: float) -> str | None:
        return await poll(self.session, url, within)

    async def call(
        self, method: str, url: str, body: dict[str, Any] | None, within: float
    ) -> tuple[int, str]:
        timeout = aiohttp.ClientTimeout(total=within)
        try:
            async with self.session.request(method, url, json=body, timeout=timeout) as resp:
                return resp.status, await resp.text()
        except aiohttp.ClientError as exc:
            raise OSError(f"{method} {url}: {exc}") from exc
