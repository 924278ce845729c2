"""The one interface every P/D adapter implements: run one attempt over a prefill → decode pair."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from coordinator.endpoint import Endpoint

if TYPE_CHECKING:
    from coordinator.proxy.call import Call
    from coordinator.proxy.hop import Hop


class PDAdapter(Protocol):
    """One P/D protocol: how a request's prefill and decode legs meet, from first leg to last.

    `run` serves `call` on the pair; the client gets the decode's answer (or the prefill's
    refusal of a bad request). It raises `Retry` when the attempt failed before anything
    reached the client (the flows try another path) and `Broken` when the decode failed
    after (the flows continue the stream). The pair's decode counts the request in flight
    for the whole attempt, prefill leg included, so a burst sees the pair busy at once.
    """

    capability: str  # what both halves of a pair register; the registry's key
    native_paths: frozenset[bytes]  # engine paths beyond /v1 generation it can split (seed 003)

    async def run(self, call: Call, prefill: Endpoint, decode: Endpoint, rid: str, hop: Hop) -> None: ...
