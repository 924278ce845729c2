"""Health of one endpoint from its `/health` checks: a pure tracker plus the aiohttp check.

Seed 002's `health_check_config`: one check is up to `retry_attempts` requests (the first
included) of `timeout` s each, and only a timeout earns another attempt; a refused
connection or an HTTP error fails the check at once (`check`). Before the first success the
engine is loading: failed checks keep it STARTING until `startup_timeout` has passed. After
READY, a failed check turns it ABNORMAL; a later success makes it READY again. DEAD and
STOPPED come from the process supervisor, never from checks.
"""

from __future__ import annotations

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
        self.failures = 0  # consecutive failed checks

    def observe(self, ok: bool, detail: str, now: float) -> Transition | None:
        """Record one check result taken at `now` (monotonic seconds)."""
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
        return self._to(EndpointStatus.ABNORMAL, f"health check failed: {detail}")

    def _to(self, status: EndpointStatus, reason: str) -> Transition | None:
        if status == self.status:
            return None
        self.status = status
        return Transition(status, reason)


TIMEOUT = "timeout"  # the `kind` of a probe that timed out: the only one retried


async def probe(session: aiohttp.ClientSession, url: str, http_timeout: float) -> tuple[bool, str]:
    """GET `url`; (True, "") on HTTP 200, else (False, what went wrong)."""
    ok, _, detail = await probe_kind(session, url, http_timeout)
    return ok, detail


async def probe_kind(session: aiohttp.ClientSession, url: str, http_timeout: float) -> tuple[bool, str, str]:
    """One request: (ok, kind of failure — `timeout`, `connect`, `http`, `error` — , detail)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=http_timeout)) as resp:
            await resp.read()
            if resp.status == 200:
                return True, "", ""
            return False, "http", f"HTTP {resp.status}"
    except TimeoutError:
        return False, TIMEOUT, f"timeout after {http_timeout:g}s"
    except aiohttp.ClientConnectorError as exc:
        return False, "connect", f"connection failed ({exc.os_error.strerror or exc.os_error})"
    except (aiohttp.ClientError, OSError) as exc:
        return False, "error", f"{type(exc).__name__}: {exc}"


async def check(session: aiohttp.ClientSession, url: str, cfg: HealthCheckConfig) -> tuple[bool, str]:
    """One health check: up to `retry_attempts` requests, the next one only after a timeout."""
    for _ in range(cfg.retry_attempts):
        ok, kind, detail = await probe_kind(session, url, cfg.timeout)
        if ok:
            return True, ""
        if kind != TIMEOUT:
            return False, detail  # refused or answered with an error: not retried (seed 002)
    return False, f"timed out {cfg.retry_attempts} times ({cfg.timeout:g}s each)"
