"""Where a stream lives in a JetStream cluster: its leader and how current each replica is.

`motor up`'s live view and `motor status` show it for MOTOR, so an operator sees which
nats-server leads the log and whether a replica fell behind or went offline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError


@dataclass(frozen=True, slots=True)
class Replica:
    """A follower of the stream's leader: its server, whether it is current, how far behind."""

    name: str
    current: bool
    offline: bool = False
    lag: int = 0


@dataclass(frozen=True, slots=True)
class StreamPlacement:
    """Who holds a stream: `leader` None on a lone server, or while no leader is elected."""

    stream: str
    replicas_wanted: int
    leader: str | None
    followers: tuple[Replica, ...] = ()
    error: str | None = None  # the stream could not be asked (NATS away, no quorum)

    def describe(self) -> str:
        """One line: `MOTOR leader n2 · n1 current, n3 lag 12 (R3)`."""
        if self.error is not None:
            return f"{self.stream}: {self.error}"
        if self.leader is None:
            if self.replicas_wanted <= 1:
                return f"{self.stream} on one server (R1)"
            return f"{self.stream}: no leader (R{self.replicas_wanted})"
        parts = []
        for r in self.followers:
            if r.offline:
                parts.append(f"{r.name} offline")
            elif r.current:
                parts.append(f"{r.name} current")
            else:
                parts.append(f"{r.name} lag {r.lag}")
        tail = f" · {', '.join(parts)}" if parts else ""
        return f"{self.stream} leader {self.leader}{tail} (R{self.replicas_wanted})"


async def stream_placement(js: JetStreamContext, stream: str, within: float = 2.0) -> StreamPlacement:
    """Ask the cluster who leads `stream` and how its replicas fare; never raises for NATS trouble."""
    try:
        async with asyncio.timeout(within):
            info = await js.stream_info(stream)
    except APIError as exc:
        return StreamPlacement(stream, 0, None, error=exc.description or str(exc))
    except (NatsTimeoutError, TimeoutError):
        return StreamPlacement(stream, 0, None, error="no answer (no JetStream quorum?)")
    except NatsError as exc:
        return StreamPlacement(stream, 0, None, error=str(exc) or type(exc).__name__)
    wanted = int(info.config.num_replicas or 1)
    cl = info.cluster
    if cl is None or cl.leader is None:
        return StreamPlacement(stream, wanted, None)
    followers = tuple(
        Replica(p.name or "?", bool(p.current), bool(p.offline), int(p.lag or 0)) for p in (cl.replicas or [])
    )
    return StreamPlacement(stream, wanted, cl.leader, followers)
