"""What an engine's `/fault_tolerance/status` says (MindIE's fault interface, seed 002): the
answer parsed into healthy | unhealthy | dead, and one poll of it. Used by the fault reporter
(`faults.py`) through the node agent's `EngineHost` (`host.py`)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

KNOWN = ("healthy", "unhealthy", "dead")


def ft_status(body: Any) -> str | None:
    """The engine status in a fault-tolerance answer (`status`/`engine_status`/`state`, nested ok)."""
    if isinstance(body, str):
        text = body.strip().lower()
        return text if text in KNOWN else None
    if isinstance(body, dict):
        for key in ("status", "engine_status", "state", "health"):
            value = ft_status(body.get(key))
            if value is not None:
                return value
        return None
    if isinstance(body, list):
        # One entry per rank: the worst wins.
        found = [s for s in (ft_status(x) for x in body) if s is not None]
        for worst in ("dead", "unhealthy", "healthy"):
            if worst in found:
                return worst
    return None


async def poll(session: aiohttp.ClientSession, url: str, http_timeout: float) -> str | None:
    """The status an engine reports now; None when it did not answer usefully."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=http_timeout)) as resp:
            if resp.status != 200:
                return None
            return ft_status(orjson.loads(await resp.read()))
    except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
        return None
