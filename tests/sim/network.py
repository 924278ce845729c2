"""The simulated network between the processes and the memory log's server.

Each process reaches the server over its own `SimLink` (a `streams.memory.link.Link`). A trip
takes a one-way latency drawn from the seed's generator. While the server is away
(`Network.outage`) or a link is cut, a request is what nats-py makes of it: buffered by the
client while it reconnects and sent once it is back, or lost when it went into a dead socket
(drawn from the seed); the caller times out either way, and a request that did land is
answered into the void. A lossy stretch drops requests and answers (a retried publish is then
a duplicate the dedupe window must catch; a lost ack makes JetStream deliver a command again);
a slow stretch multiplies the latency (leases renew late). Trips run in the network's own
context: a process frozen or killed after sending still has its request arrive.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable
from typing import Any, TypeVar

from tests.sim.loop import SimLoop

T = TypeVar("T")

Request = Callable[[], None]


class Network:
    """Every link, and the faults that touch all of them at once."""

    def __init__(
        self, loop: SimLoop, rng: random.Random, *, latency: tuple[float, float] = (0.0002, 0.002)
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.latency = latency
        self.context = contextvars.Context()  # no process: never frozen, never killed
        self.links: list[SimLink] = []
        self._outage = False
        self.hold_share = 0.5  # of requests sent into a dead connection, how many nats-py kept

    def link(self, name: str) -> SimLink:
        link = SimLink(self, name)
        self.links.append(link)
        return link

    @property
    def outage(self) -> bool:
        return self._outage

    def set_outage(self, down: bool) -> None:
        """The server goes away (or comes back) for every client."""
        self._outage = down
        for link in self.links:
            link.changed()

    def later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        self.loop.call_later(delay, fn, *args, context=self.context)


class SimLink:
    """One process's connection to the server."""

    def __init__(self, net: Network, name: str) -> None:
        self.net = net
        self.name = name
        self.cut = False  # partitioned from the server
        self.closed = False  # its process died: nothing reaches it any more
        self.slow = 1.0  # latency factor
        self.loss = 0.0  # chance a request or an answer is lost on the way
        self.held: list[Request] = []
        self._listeners: dict[asyncio.Event, None] = {}  # in order (a set: memory order)
        self.sent = 0
        self.reconnects = 0
        self._was_up = True

    @property
    def up(self) -> bool:
        return not (self.net.outage or self.cut or self.closed)

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        self.changed()

    def close(self) -> None:
        """The process died: what it had in flight still arrives, nothing comes back."""
        self.closed = True
        self.held.clear()
        self.changed()

    def changed(self) -> None:
        if self.up and not self._was_up:
            self.reconnects += 1
        self._was_up = self.up
        if self.up and self.held:
            held, self.held = self.held, []
            for req in held:
                self._travel(req)
        for ev in list(self._listeners):
            ev.set()

    # ------------------------------------------------------------------ Link

    def _hop(self) -> float:
        lo, hi = self.net.latency
        return self.net.rng.uniform(lo, hi) * self.slow

    def _lost(self) -> bool:
        return self.loss > 0 and self.net.rng.random() < self.loss

    def _send(self, req: Request) -> None:
        self.sent += 1
        if not self.up:
            if not self.closed and self.net.rng.random() < self.net.hold_share:
                self.held.append(req)  # buffered while reconnecting
            return
        self._travel(req)

    def _travel(self, req: Request) -> None:
        if self._lost():
            return
        self.net.later(self._hop(), self._arrive, req)

    def _arrive(self, req: Request) -> None:
        if self.net.outage:  # the server is away: into a dead socket, or kept for the reconnect
            if not self.closed and self.net.rng.random() < self.net.hold_share:
                self.held.append(req)
            return
        req()

    async def call(self, op: Callable[[], T], within: float) -> T:
        loop = self.net.loop
        fut: asyncio.Future[T] = loop.create_future()

        def at_server() -> None:
            try:
                result: tuple[bool, object] = (True, op())
            except Exception as exc:
                # The error travels back, not the server's stack (which would hold this frame,
                # and this frame the result: a reference cycle a refused request).
                result = (False, exc.with_traceback(None))
            if self._lost():
                return
            self.net.later(self._hop(), answer, result)

        def answer(result: tuple[bool, object]) -> None:
            if fut.done() or not self.up:
                return  # nobody waits for it, or it went into a dead connection
            ok, value = result
            if ok:
                fut.set_result(value)  # type: ignore[arg-type]
            else:
                fut.set_exception(value)  # type: ignore[arg-type]

        self._send(at_server)
        # One timer, not `asyncio.timeout`'s machinery around every request: nothing but `fut`
        # is waited for here.
        timer = loop.call_later(within, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    def send(self, op: Callable[[], object]) -> None:
        self._send(lambda: (op(), None)[1])

    async def arrive(self) -> bool:
        await asyncio.sleep(self._hop())
        return self.up and not self._lost()

    def listen(self, ev: asyncio.Event) -> None:
        self._listeners[ev] = None

    def unlisten(self, ev: asyncio.Event) -> None:
        self._listeners.pop(ev, None)


def _expire(fut: asyncio.Future[Any]) -> None:
    """No answer came in time: the caller's TimeoutError, as `Link.call` promises."""
    if not fut.done():
        fut.set_exception(TimeoutError())
