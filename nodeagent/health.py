"""Health of one endpoint from its `/health` probes: a pure tracker plus the aiohttp probe.

Before the first success the engine is loading: failures keep it STARTING until
`startup_timeout` has passed. After READY, a failed probe is retried `retry_attempts` times
before the endpoint turns ABNORMAL; a later success makes it READY again. DEAD and STOPPED
come from the process supervisor, never from probes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from core.config import HealthCheckConfig
from core.events import EndpointStatus


@dataclass(frozen=True, slots=True)
class Transition:
    status: EndpointStatus
    reason: str


class HealthTracker:
    """Turns a series of probe results into status transitions (None when nothing changes)."""

    def __init__(self, cfg: HealthCheckConfig, started: float) -> None:
        self.cfg = cfg
        self.started = started
        self.status = EndpointStatus.STARTING
        self.ever_ready = False
        self.failures = 0  # consecutive failed probes

    def observe(self, ok: bool, detail: str, now: float) -> Transition | None:
        """Record one probe result taken at `now` (monotonic seconds)."""
        if ok:
            self.failures = 0
            self.ever_ready = True
            return self._to(EndpointStatus.READY, "health check passed")
        self.failures += 1
        if not self.ever_ready:
            waited = now - self.started
            if waited < self.cfg.startup_timeout:
                return None
            return self._to(
                EndpointStatus.ABNORMAL,
                f"not healthy within startup_timeout {self.cfg.startup_timeout:g}s: {detail}",
            )
        if self.failures <= self.cfg.retry_attempts:
            return None
        return self._to(EndpointStatus.ABNORMAL, f"health check failed {self.failures} times: {detail}")

    def _to(self, status: EndpointStatus, reason: str) -> Transition | None:
        if status == self.status:
            return None
        self.status = status
        return Transition(status, reason)


async def probe(session: aiohttp.ClientSession, url: str, http_timeout: float) -> tuple[bool, str]:
    """GET `url`; (True, "") on HTTP 200, else (False, what went wrong)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=http_timeout)) as resp:
            await resp.read()
            if resp.status == 200:
                return True, ""
            return False, f"HTTP {resp.status}"
    except TimeoutError:
        return False, f"timeout after {http_timeout:g}s"
    except aiohttp.ClientConnectorError as exc:
        return False, f"connection failed ({exc.os_error.strerror or exc.os_error})"
    except (aiohttp.ClientError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


async def wait_healthy(session: aiohttp.ClientSession, url: str, http_timeout: float, within: float) -> bool:
    """Probe until healthy or `within` seconds passed (adoption check after a restart)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        ok, _ = await probe(session, url, http_timeout)
        if ok or loop.time() >= deadline:
            return ok
        await asyncio.sleep(0.2)
