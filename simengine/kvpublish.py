"""The builtin engine's KV events over vLLM's protocol (`core.kvwire`): ZMQ PUB + ROUTER replay.

Events the block pool reports during one turn of the event loop go out as one batch (vLLM
sends one batch per scheduler step), numbered from 0; the last `buffer_steps` batches are
kept for the replay socket. Configured as vLLM is: `--kv-events-config '{"enable_kv_cache_events":
true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from core.kvwire import END_SEQ, KvEvent, decode_seq, encode_payload, encode_seq

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvEventsOptions:
    """Where the engine publishes its KV events (vLLM's `KVEventsConfig` fields we use)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> KvEventsOptions | None:
        """From vLLM's JSON; None when events are not enabled. ValueError on a bad one."""
        if not raw.get("enable_kv_cache_events", False):
            return None
        if raw.get("publisher", "zmq") != "zmq":
            raise ValueError(f"kv events publisher {raw.get('publisher')!r}: only 'zmq' is supported")
        endpoint = raw.get("endpoint", "tcp://*:5557")
        replay = raw.get("replay_endpoint")
        if not isinstance(endpoint, str) or (replay is not None and not isinstance(replay, str)):
            raise ValueError("kv events endpoint and replay_endpoint must be strings")
        steps = raw.get("buffer_steps", 10_000)
        if not isinstance(steps, int) or steps < 1:
            raise ValueError("kv events buffer_steps must be a positive int")
        return cls(endpoint, replay, str(raw.get("topic", "")), steps)


class KvPublisher:
    """Batches the pool's events per loop turn, publishes them, serves replays."""

    def __init__(self, opts: KvEventsOptions, dp_rank: int = 0) -> None:
        self.opts = opts
        self.dp_rank = dp_rank
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(opts.endpoint)
        self._router: zmq.asyncio.Socket | None = None
        self._replayer: asyncio.Task[None] | None = None
        if opts.replay_endpoint is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(opts.replay_endpoint)
        self._topic = opts.topic.encode()
        self._pending: list[KvEvent] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=opts.buffer_steps)
        self._next_seq = 0
        self.skip_seqs = 0  # faults: batches numbered and buffered but not sent (a gap to replay)

    def start(self) -> None:
        """Serve the replay socket (call on the running loop)."""
        if self._router is not None:
            self._replayer = asyncio.get_running_loop().create_task(self._serve_replay())

    def push(self, ev: KvEvent) -> None:
        """One event from the block pool; sent with the others of this loop turn."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(ev)

    def _flush(self) -> None:
        events, self._pending = self._pending, []
        if not events:
            return
        seq = self._next_seq
        self._next_seq += 1
        payload = encode_payload(time.time(), events, self.dp_rank)
        self._buffer.append((seq, payload))
        if self.skip_seqs > 0:
            self.skip_seqs -= 1
            return
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)

    def send_garbage(self, n: int) -> None:
        """Faults: `n` malformed messages (a wrong frame count, a short sequence frame, a
        payload that is not msgpack), none of which consumes a sequence number."""
        shapes = (
            (self._topic, encode_seq(self._next_seq)),
            (self._topic, b"\x01\x02", b"\x90"),
            (self._topic, encode_seq(self._next_seq), b"\xc1 not msgpack"),
        )
        for i in range(n):
            with contextlib.suppress(zmq.Again):
                self._pub.send_multipart(shapes[i % len(shapes)], flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self._router is not None
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                log.warning("kv events replay: a request of %d frames, want 3", len(frames))
                continue
            client, _, start = frames
            try:
                first = decode_seq(start)
            except ValueError:
                log.warning("kv events replay: bad start sequence %r", start[:16])
                continue
            # vLLM 0.32's replay shape: the topic travels with each batch (core.kvwire).
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await router.send_multipart((client, b"", self._topic, encode_seq(seq), payload))
            await router.send_multipart((client, b"", b"", encode_seq(END_SEQ), b""))

    async def close(self) -> None:
        """Stop serving replays and close the sockets."""
        if self._replayer is not None:
            self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
        self._pub.close(0)
        if self._router is not None:
            self._router.close(0)
        self._ctx.term()
