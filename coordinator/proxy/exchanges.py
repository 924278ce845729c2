"""Every engine exchange under way, by endpoint and by engine request id: what lets the
coordinator stop waiting on an engine the moment it has reason to.

Two reasons, both the coordinator's: the endpoint left routing (its health went ABNORMAL, its
instance ISOLATED or INACTIVE or gone, a circuit opened on another request's failure: `leave`),
and a hedge of the same request answered first (`lose`). The exchange's waiter then fails as
if the engine had (`UpstreamConn.depart`), so the attempt loop does what it does after a kill:
a request that had sent the client nothing is tried elsewhere at once, a stream goes on from
what it delivered. Its connection is cut, which is vLLM's and the builtin engine's abort.
"""

from __future__ import annotations

import logging

from coordinator.proxy.upstream import UpstreamConn

log = logging.getLogger(__name__)


class Exchanges:
    """The live exchanges of one pool (added by `Upstreams.open`, dropped by `ended`)."""

    __slots__ = ("by_key",)

    def __init__(self) -> None:
        self.by_key: dict[str, set[UpstreamConn]] = {}

    def started(self, conn: UpstreamConn, key: str, rid: str) -> None:
        """`conn` carries request `rid` to endpoint `key` from now on."""
        conn.ep_key, conn.rid = key, rid
        live = self.by_key.get(key)
        if live is None:
            self.by_key[key] = {conn}
        else:
            live.add(conn)

    def ended(self, conn: UpstreamConn) -> None:
        """`conn`'s exchange is over (released, closed or failed)."""
        live = self.by_key.get(conn.ep_key)  # type: ignore[arg-type]  # set: the caller checked
        conn.ep_key = None
        if live is not None:
            live.discard(conn)

    def leave(self, key: str, why: str) -> int:
        """Endpoint `key` left routing: end every exchange on it. Returns how many."""
        live = self.by_key.get(key)
        if not live:
            return 0
        conns = list(live)
        for conn in conns:
            conn.depart(f"{key} left routing ({why})", left=True)
        log.warning("%s left routing (%s): %d request(s) on it go on elsewhere", key, why, len(conns))
        return len(conns)

    def lose(self, rid: str) -> int:
        """A hedge answered first: end every exchange of the attempt `rid` it raced (each
        attempt has its own engine request id). Returns how many. A look at every live
        exchange: it happens once per hedge won, not per request."""
        conns = [c for live in self.by_key.values() for c in live if c.rid == rid]
        for conn in conns:
            conn.depart(f"{conn.ep_key}: a hedge of this request answered first", lost=True)
        return len(conns)
