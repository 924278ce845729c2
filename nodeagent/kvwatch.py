"""Follow each engine's KV events and keep its compacted view in the `motor_kvview` bucket.

One `KvFollower` per running engine process (a new process, a new follower: its sequence
numbers start over): it subscribes to the engine's ZMQ PUB socket, first asks the replay
socket for everything the engine still buffers (it may have run before we listened), and
when a sequence number is skipped asks for the missing ones (`recover_gap`). Events are
folded into `core.kvblocks.EndpointBlocks`; every `interval` the set of blocks, if it changed,
is written as one value under the endpoint's key — never the raw events, so a coordinator
reads one value per endpoint whatever the event rate. A frame that does not decode is counted
and skipped (`on_malformed`); NATS away, the writes fail and the next one after it is back
carries the whole view, so nothing is lost but time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import zmq
import zmq.asyncio

from core import subjects
from core.events import EndpointSpec, EndpointStatus
from core.kvblocks import EndpointBlocks, encode_view
from core.kvwire import (
    KvBatch,
    KvWireError,
    decode_frames,
    decode_replay,
    replay_request,
)
from nodeagent.engines import Engines, StatusChange
from nodeagent.kvaddr import KvAddrs, kv_events_config
from nodeagent.metrics import AgentMetrics
from nodeagent.settings import AgentSettings
from streams.definitions import KVVIEW_BUCKET
from streams.log import Log

log = logging.getLogger(__name__)

Put = Callable[[str, bytes], Awaitable[object]]


class KvFollower:
    """One engine process's KV events, folded and published under `key`."""

    def __init__(
        self,
        key: str,
        addrs: KvAddrs,
        put: Put,
        metrics: AgentMetrics,
        zctx: zmq.asyncio.Context,
        *,
        interval: float = 0.2,
        replay_timeout: float = 2.0,
    ) -> None:
        self.key = key
        self.addrs = addrs
        self.put = put
        self.metrics = metrics
        self.zctx = zctx
        self.interval = interval
        self.replay_timeout = replay_timeout
        self.blocks = EndpointBlocks()
        self.expected: int | None = None  # the next sequence number due
        self.malformed = 0
        self.gaps_recovered = 0
        self.gaps_lost = 0
        self.published_version = -1
        self._failing = False
        self._labels = (metrics.node_id, key)

    # ------------------------------------------------------------------ events

    def take(self, batch: KvBatch) -> None:
        """Fold a batch in sequence order; one seen already (a replay overlap) is dropped."""
        if self.expected is not None and batch.seq < self.expected:
            return
        self.blocks.apply_all(batch.events)
        self.expected = batch.seq + 1

    def on_malformed(self, what: str, exc: Exception) -> None:
        """A frame that is not a KV event batch: counted, logged, skipped."""
        self.malformed += 1
        self.metrics.kv_frames_malformed.labels(*self._labels).inc()
        log.warning(
            "KV events of %s: skipped a malformed %s (after seq %s): %s", self.key, what, self.expected, exc
        )

    async def on_frames(self, frames: Sequence[bytes]) -> None:
        """One message from the PUB socket."""
        try:
            batch = decode_frames(frames)
        except KvWireError as exc:
            self.on_malformed("message", exc)
            return
        if self.expected is not None and batch.seq > self.expected:
            await self.recover_gap(self.expected, batch.seq)
        self.take(batch)

    async def recover_gap(self, start: int, until: int) -> None:
        """Sequences [start, until) were missed: fetch them from the replay socket."""
        log.info(
            "KV events of %s: sequences %d..%d missed, asking the replay socket", self.key, start, until - 1
        )
        await self.replay(start)
        if self.expected is not None and self.expected >= until:
            self.gaps_recovered += 1
            self.metrics.kv_gaps.labels(*self._labels, "recovered").inc()
            return
        self.gaps_lost += 1
        self.metrics.kv_gaps.labels(*self._labels, "lost").inc()
        log.warning(
            "KV events of %s: sequences %s..%d not replayed (beyond the engine's buffer or no replay "
            "socket); its view may hold blocks it evicted until they are stored again",
            self.key,
            self.expected,
            until - 1,
        )
        self.expected = None  # go on from the next batch we get

    async def replay(self, start: int) -> bool:
        """Ask the replay socket for every batch from `start` on and fold them; True when it
        answered to the end."""
        if self.addrs.replay is None:
            return False
        dealer = self.zctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.addrs.replay)
        try:
            await dealer.send_multipart(replay_request(start))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), self.replay_timeout)
                try:
                    batch = decode_replay(frames)
                except KvWireError as exc:
                    self.on_malformed("replay message", exc)
                    continue
                if batch is None:
                    return True
                self.take(batch)
        except TimeoutError:
            log.warning(
                "KV events of %s: the replay socket did not finish within %.1f s",
                self.key,
                self.replay_timeout,
            )
        finally:
            dealer.close(0)
        return False

    # ------------------------------------------------------------------ publishing

    async def publish(self) -> bool:
        """Write the view when it changed; False when the write failed (tried again later)."""
        version = self.blocks.version
        if version == self.published_version:
            return True
        chains = self.blocks.chains()
        try:
            await self.put(self.key, encode_view(self.blocks.block_size, chains))
        except Exception as exc:  # NATS away or slow: the next tick sends the whole view again
            self.metrics.kv_view_publishes.labels(self.metrics.node_id, "failed").inc()
            if not self._failing:
                log.warning(
                    "KV view of %s not written (%s); retrying every %.1f s", self.key, exc, self.interval
                )
            self._failing = True
            return False
        if self._failing:
            log.info("KV view of %s written again (%d blocks)", self.key, len(chains))
        self._failing = False
        self.published_version = version
        self.metrics.kv_view_publishes.labels(self.metrics.node_id, "ok").inc()
        self.metrics.kv_view_blocks.labels(*self._labels).set(len(chains))
        return True

    async def _publish_loop(self) -> None:
        while True:
            await self.publish()
            await asyncio.sleep(self.interval)

    async def run(self) -> None:
        """Follow the engine until cancelled."""
        sub = self.zctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.addrs.sub)
        publisher = asyncio.create_task(self._publish_loop(), name=f"kvview-{self.key}")
        try:
            # What the engine stored before we listened; an engine that has sent nothing yet
            # starts at sequence 0, so a first batch lost on the way is a gap like any other.
            if await self.replay(0) and self.expected is None:
                self.expected = 0
            while True:
                await self.on_frames(await sub.recv_multipart())
        finally:
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
            sub.close(0)


def _log_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r (the view stays as last written)", task.get_name(), task.exception())


class KvWatch:
    """The node agent's part: one follower per READY engine process that publishes KV events."""

    def __init__(
        self,
        node_id: str,
        addrs_of: Callable[[EndpointSpec], KvAddrs | None],
        put: Put,
        metrics: AgentMetrics,
        *,
        interval: float = 0.2,
    ) -> None:
        self.node_id = node_id
        self.addrs_of = addrs_of
        self.put = put
        self.metrics = metrics
        self.interval = interval
        self.zctx = zmq.asyncio.Context()
        self.followers: dict[int, tuple[int | None, KvFollower, asyncio.Task[None]]] = {}
        self._clearing: set[asyncio.Task[None]] = set()

    def on_status(
        self, endpoint_id: int, spec: EndpointSpec | None, status: EndpointStatus, pid: int | None
    ) -> None:
        """An endpoint's status changed: follow a READY engine, let go of a stopped one."""
        current = self.followers.get(endpoint_id)
        if status == EndpointStatus.READY and spec is not None:
            if current is not None and current[0] == pid:
                return
            addrs = self.addrs_of(spec)
            if addrs is None:
                return
            self._drop(spec.id)
            key = subjects.kv_view_key(self.node_id, spec.id)
            follower = KvFollower(key, addrs, self.put, self.metrics, self.zctx, interval=self.interval)
            task = asyncio.create_task(follower.run(), name=f"kvfollow-{key}")
            task.add_done_callback(_log_end)
            self.followers[spec.id] = (pid, follower, task)
            log.info("following the KV events of %s at %s (pid %s)", key, addrs.sub, pid)
        elif status in (EndpointStatus.DEAD, EndpointStatus.STOPPED) and current is not None:
            self._drop(endpoint_id)
            key = subjects.kv_view_key(self.node_id, endpoint_id)
            task = asyncio.create_task(self._clear(key), name=f"kvclear-{key}")
            self._clearing.add(task)
            task.add_done_callback(self._clearing.discard)

    def _drop(self, endpoint_id: int) -> None:
        entry = self.followers.pop(endpoint_id, None)
        if entry is not None:
            entry[2].cancel()

    async def _clear(self, key: str) -> None:
        """The engine is gone and so is its cache: an empty view (best effort)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.put(key, encode_view(None, [])), 2.0)

    async def close(self) -> None:
        """Stop every follower."""
        tasks = [t for _, _, t in self.followers.values()]
        self.followers.clear()
        if self._clearing:
            await asyncio.wait(self._clearing, timeout=2.5)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.zctx.term()


def start_kvwatch(
    settings: AgentSettings, engines: Engines, motor: Log, metrics: AgentMetrics
) -> KvWatch | None:
    """A KvWatch told of every status change of `engines`, when the section publishes KV events."""
    if kv_events_config(settings.section) is None:
        return None
    watch = KvWatch(settings.node_id, engines.kv_addrs, motor.kv(KVVIEW_BUCKET).put, metrics)
    inner = engines.on_change

    def on_change(c: StatusChange) -> None:
        inner(c)
        ep = engines.endpoints.get(c.endpoint_id)
        watch.on_status(c.endpoint_id, ep.spec if ep is not None else None, c.status, c.pid)

    engines.on_change = on_change
    return watch
