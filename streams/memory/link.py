"""How a memory-log client reaches its server: the one place a network can be put in between.

A `Link` carries a request to the server, runs it there (a synchronous server operation) and
carries the answer back; it carries the server's pushes (a consumer's deliveries) to the client.
`DirectLink` is a perfect network: always up, and each trip a bare turn of the event loop, so
code awaiting the log still yields as it does over a socket. The simulator's network
(tests/sim/network.py) delays, drops, holds and duplicates trips and takes links down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Link(Protocol):
    """One client's connection to the memory server."""

    @property
    def up(self) -> bool:
        """Connected now."""
        ...

    @property
    def reconnects(self) -> int:
        """Times it came up again after being down."""
        ...

    async def call(self, op: Callable[[], T], within: float) -> T:
        """Run `op` at the server and return (or raise) what it did; TimeoutError when no answer
        came back within `within` seconds (`op` may have run all the same)."""
        ...

    def send(self, op: Callable[[], object]) -> None:
        """Run `op` at the server, expecting no answer (an ack, a nak: fire and forget)."""
        ...

    async def arrive(self) -> bool:
        """A push from the server travels to this client; False when it was lost on the way."""
        ...

    def listen(self, ev: asyncio.Event) -> None:
        """Set `ev` whenever the link goes up or down."""
        ...

    def unlisten(self, ev: asyncio.Event) -> None: ...


class DirectLink:
    """Always up, no delay beyond one turn of the event loop."""

    up = True
    reconnects = 0

    async def call(self, op: Callable[[], T], within: float) -> T:
        await asyncio.sleep(0)
        return op()

    def send(self, op: Callable[[], object]) -> None:
        asyncio.get_running_loop().call_soon(op)

    async def arrive(self) -> bool:
        await asyncio.sleep(0)
        return True

    def listen(self, ev: asyncio.Event) -> None:
        pass

    def unlisten(self, ev: asyncio.Event) -> None:
        pass
