"""A swarm of anonymous connections that trickle bytes at a server, run as its own process so
the client measuring the server is not slowed by the attack's own event loop:

    python -m tests.integration.trickle_swarm PORT [ATTACKERS]

Each attacker opens a connection, sends the opening of its mode and then drips one byte every
`DRIP_EVERY` s (each byte would reset an idle timer); one the server ends comes back
`RECONNECT_AFTER` s later (jittered). Modes: `head` (a head that never ends), `body` (a whole
keyless head announcing the largest body, the body dripped), `public` (a 16,000-byte body
dripped to a route that needs no key) and `flood` (a keyless head, then the largest body but
one byte at once). Prints `ramped` once every attacker connected once; on SIGTERM, one JSON
line of counts, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import signal
import sys
from collections import Counter

import orjson

MAX_BODY = 8 * 1024 * 1024  # coordinator.max_body_bytes' default
DRIP_EVERY = 2.0
RECONNECT_AFTER = 5.0
FLOODERS = 40
_KEYLESS = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % MAX_BODY
OPENING = {
    "head": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-drip: ",
    "body": _KEYLESS,
    "public": b"POST /liveness HTTP/1.1\r\nhost: x\r\ncontent-length: 16000\r\n\r\n",
    "flood": _KEYLESS,
}
FLOOD = b"x" * (MAX_BODY - 1)


class Attacker(asyncio.Protocol):
    """One anonymous connection that drips a byte every `DRIP_EVERY` s until the server ends it."""

    def __init__(self, swarm: Swarm, mode: str) -> None:
        self.swarm = swarm
        self.mode = mode
        self.transport: asyncio.Transport | None = None
        self.tick: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.swarm.open.add(self)
        transport.write(OPENING[self.mode])
        if self.mode == "flood":
            transport.write(FLOOD)
        self.tick = self.swarm.loop.call_later(random.uniform(0, DRIP_EVERY), self.drip)

    def drip(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"a")
            self.swarm.drips += 1
            self.tick = self.swarm.loop.call_later(DRIP_EVERY, self.drip)

    def data_received(self, data: bytes) -> None:
        if data.startswith(b"HTTP/1.1 "):
            self.swarm.answers[data[9:12].decode("latin-1", "replace")] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if self.tick is not None:
            self.tick.cancel()
        self.swarm.open.discard(self)
        self.swarm.lost(self.mode)


class Swarm:
    """`n` anonymous connections kept open: each one the server ends comes back."""

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.n = n
        self.loop = asyncio.get_running_loop()
        self.open: set[Attacker] = set()
        self.answers: Counter[str] = Counter()
        self.connects = 0
        self.failed = 0
        self.drips = 0
        self.most_open = 0
        self.ramped = asyncio.Event()  # every attacker connected once
        self.stopping = False
        self.gate = asyncio.Semaphore(256)  # connects in flight: within the listen backlog
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for i in range(self.n):
            self._spawn("flood" if i < FLOODERS else ("head", "body", "public")[i % 3], 0.0)

    def lost(self, mode: str) -> None:
        if not self.stopping:
            self._spawn(mode, RECONNECT_AFTER * random.uniform(0.5, 1.5))

    def _spawn(self, mode: str, after: float) -> None:
        task = self.loop.create_task(self._connect(mode, after))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _connect(self, mode: str, after: float) -> None:
        if after:
            await asyncio.sleep(after)
        async with self.gate:
            if self.stopping:
                return
            try:
                await self.loop.create_connection(lambda: Attacker(self, mode), "127.0.0.1", self.port)
            except OSError:
                self.failed += 1
                self.lost(mode)
                return
            self.connects += 1
            self.most_open = max(self.most_open, len(self.open))
            if self.connects >= self.n:
                self.ramped.set()

    def stop(self) -> None:
        self.stopping = True
        for t in list(self.tasks):
            t.cancel()
        for a in list(self.open):
            if a.transport is not None:
                a.transport.abort()

    def counts(self) -> dict[str, object]:
        return {
            "attackers": self.n,
            "connects": self.connects,
            "failed": self.failed,
            "open": len(self.open),
            "most_open": self.most_open,
            "drips": self.drips,
            "answers": dict(self.answers),
        }


async def run(port: int, n: int) -> None:
    """Attack until SIGTERM, then print the counts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 1000
    if hard == resource.RLIM_INFINITY or hard >= want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    swarm = Swarm(port, n)
    done = asyncio.Event()
    swarm.loop.add_signal_handler(signal.SIGTERM, done.set)
    swarm.start()
    ramp = swarm.loop.create_task(swarm.ramped.wait())
    ramp.add_done_callback(lambda _: print("ramped", flush=True))
    await done.wait()
    ramp.cancel()
    counts = swarm.counts()
    swarm.stop()
    with contextlib.suppress(Exception):
        await asyncio.sleep(0.1)
    print(orjson.dumps(counts).decode(), flush=True)


if __name__ == "__main__":
    asyncio.run(run(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 10_000))
