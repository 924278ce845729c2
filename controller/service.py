"""The controller shell: fold MOTOR and MOTOR_HB, hold or wait for the lease, decide, append.

Start-up is checkpoint + tail. Every controller follows the log live (a hot standby); only
the lease holder decides, after it has folded everything the stream held when it won the
lease, and announces itself with `controller.leader_changed`. Failures of NATS or of an
append are logged and retried on the next tick; nothing here ends the process but `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from controller.appender import Appender
from controller.decide import decide
from controller.decision import Decision
from controller.fold import Fold
from controller.leader import Lease
from controller.metrics import ControllerMetrics
from core.config import ClusterConfig
from core.events import LeaderChanged, LeaderChangedData
from core.ids import derive_id
from core.state import ClusterState
from streams.checkpoint import load_checkpoint, save_checkpoint
from streams.connection import NatsOptions, connect
from streams.definitions import HB_STREAM, MOTOR_STREAM, ensure_streams
from streams.errors import StreamsError
from streams.reader import Follower, stream_last_seq

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "controller"


@dataclass(frozen=True, slots=True)
class Status:
    """What `/readiness` and `/v1/instances` report about this controller."""

    id: str
    leader: bool
    caught_up: bool
    leader_id: str | None
    term: int
    last_seq: int


class ControllerService:
    """One controller process: leader or hot standby."""

    def __init__(
        self,
        cfg: ClusterConfig,
        *,
        controller_id: str,
        nats_urls: list[str] | None = None,
        clock: Callable[[], float] = time.time,
        checkpoint_key: str = CHECKPOINT_KEY,
    ) -> None:
        self.cfg = cfg
        self.id = controller_id
        self.nats_urls = nats_urls
        self.clock = clock
        self.checkpoint_key = checkpoint_key
        self.metrics = ControllerMetrics(controller_id)
        self.fold = Fold()
        self.caught_up = asyncio.Event()
        self.started = asyncio.Event()
        self.leader = False
        self.checkpoint_seq = 0
        self._lease: Lease | None = None
        self._appender: Appender | None = None
        self._nc: Client | None = None
        # Loops also check this: a client library that turns a cancellation into its own
        # error (seen with request timeouts) must not keep a loop alive after `stop`.
        self._stopping = False

    @property
    def state(self) -> ClusterState:
        return self.fold.state

    def status(self) -> Status:
        s = self.fold.state
        return Status(
            id=self.id,
            leader=self.leader,
            caught_up=self.caught_up.is_set(),
            leader_id=s.leader.leader_id if s.leader else None,
            term=s.leader.term if s.leader else 0,
            last_seq=s.last_seq,
        )

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; then give the lease up and close the connection."""
        ctrl = self.cfg.controller
        async with AsyncExitStack() as stack:
            opts = NatsOptions.from_config(self.cfg.nats, self.nats_urls)
            nc = await connect(opts, name=f"motor-controller-{self.id}")
            self._nc = nc
            stack.push_async_callback(_close, nc)
            js = nc.jetstream()
            await ensure_streams(js, self.cfg.nats, lease_ttl=ctrl.lease_ttl)
            await self._load_checkpoint(nc, js)
            self._appender = Appender(js, self.fold, self.metrics)
            self._lease = Lease(js, self.id, ctrl.lease_ttl)
            stack.push_async_callback(self._step_down_and_release)
            motor = Follower(nc, MOTOR_STREAM, start_seq=self.fold.state.last_seq + 1)
            hb = Follower(nc, HB_STREAM)
            stack.push_async_callback(motor.close)
            stack.push_async_callback(hb.close)
            # These run until cancelled; any of them ending means the controller cannot go on.
            loops = [
                asyncio.create_task(self._follow_motor(motor), name="follow-motor"),
                asyncio.create_task(self._follow_hb(hb), name="follow-hb"),
                asyncio.create_task(self._lead(nc, js), name="lease"),
                asyncio.create_task(self._decide_loop(js), name="decide"),
            ]
            catching_up = asyncio.create_task(self._wait_caught_up(motor, hb), name="caught-up")
            self.started.set()
            stopper = asyncio.create_task(stop.wait(), name="stop")
            try:
                done, _ = await asyncio.wait([stopper, *loops], return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper:
                        exc = t.exception()
                        raise exc if exc is not None else StreamsError(f"{t.get_name()} ended")
            finally:
                self._stopping = True
                every = [stopper, catching_up, *loops]
                for t in every:
                    t.cancel()
                _, stuck = await asyncio.wait(every, timeout=10.0)
                if stuck:
                    log.error("tasks did not stop: %s", ", ".join(t.get_name() for t in stuck))

    async def _load_checkpoint(self, nc: Client, js: JetStreamContext) -> None:
        try:
            state = await load_checkpoint(js, self.checkpoint_key)
        except StreamsError as exc:
            log.warning("checkpoint unusable (%s); replaying the whole log", exc)
            state = None
        if state is not None and state.last_seq > (last := await stream_last_seq(nc, MOTOR_STREAM)):
            # The log lost its tail after the checkpoint: new events will reuse those sequence
            # numbers, and the checkpoint tells of a past the log no longer has. The log wins;
            # nodes re-register with what they run and lost instances are re-adopted.
            log.warning(
                "checkpoint at seq %d is ahead of %s (last seq %d): the log lost its tail; "
                "replaying the log instead",
                state.last_seq,
                MOTOR_STREAM,
                last,
            )
            state = None
        if state is not None:
            log.info(
                "checkpoint at seq %d: %d nodes, %d instances",
                state.last_seq,
                len(state.nodes),
                len(state.instances),
            )
            self.checkpoint_seq = state.last_seq
        self.fold = Fold(state)

    async def _follow_motor(self, follower: Follower) -> None:
        fold, m = self.fold, self.metrics
        counter = m.events.labels(MOTOR_STREAM)
        async for rec in follower:
            fold.motor(rec)
            counter.inc()
        raise StreamsError("MOTOR follower ended")

    async def _follow_hb(self, follower: Follower) -> None:
        fold = self.fold
        counter = self.metrics.events.labels(HB_STREAM)
        lag = self.metrics.hb_lag
        caught_up = follower.caught_up
        async for rec in follower:
            fold.heartbeat(rec)
            counter.inc()
            if caught_up.is_set():  # the replay of old heartbeats is not lag
                lag.observe(max(0.0, time.time() - rec.event.ts))
        raise StreamsError("MOTOR_HB follower ended")

    async def _wait_caught_up(self, motor: Follower, hb: Follower) -> None:
        # Heartbeats too: deciding on registration-time liveness would call live nodes silent.
        await motor.caught_up.wait()
        await hb.caught_up.wait()
        self.caught_up.set()
        self.fold.changed.set()
        log.info(
            "caught up at seq %d (%d nodes, %d instances)",
            self.fold.state.last_seq,
            len(self.state.nodes),
            len(self.state.instances),
        )

    # ------------------------------------------------------------------ lease

    async def _lead(self, nc: Client, js: JetStreamContext) -> None:
        assert self._lease is not None
        lease = self._lease
        ttl = self.cfg.controller.lease_ttl
        renew_in = ttl / 2
        await self.caught_up.wait()
        while not self._stopping:
            if not self.leader:
                s = self.fold.state
                if await lease.acquire(term=(s.leader.term if s.leader else 0) + 1):
                    await self._take_over(nc, lease)
                    continue
                await asyncio.sleep(min(1.0, ttl / 6))  # poll: an expired key leaves no event
            else:
                await asyncio.sleep(renew_in)
                renewed = await lease.renew()
                if not lease.held:
                    self._step_down("lease lost")
                # A failed renewal (server busy, reconnecting) is retried sooner.
                renew_in = ttl / 2 if renewed else ttl / 6

    async def _take_over(self, nc: Client, lease: Lease) -> None:
        """Fold everything the stream holds now, then announce the new reign."""
        assert self._appender is not None
        target = await stream_last_seq(nc, MOTOR_STREAM)
        if not await self.fold.reached(target, within=self.cfg.controller.lease_ttl):
            log.warning("won the lease but could not fold to seq %d in time; giving it back", target)
            await lease.release()
            return
        while True:
            if not lease.valid():
                return
            prev = self.fold.state.leader
            data = LeaderChangedData(
                leader_id=self.id, previous=prev.leader_id if prev else None, term=lease.term
            )
            ev = LeaderChanged(
                id=derive_id("leader", self.id, lease.term, target),
                ts=self.clock(),
                source=f"controller/{self.id}",
                data=data,
            )
            if await self._appender.append([Decision(ev)], lease.valid) == 1:
                break
            # Someone wrote the leader subject after our fold: fold it, then try again.
            await self.fold.reached(self.fold.state.last_seq + 1, within=0.5)
        self.leader = True
        self.metrics.is_leader.set(1)
        self.metrics.leader_changes.inc()
        log.info("leader now (term %d)", lease.term)
        self.fold.changed.set()

    def _step_down(self, why: str) -> None:
        if self.leader:
            log.warning("no longer leader: %s", why)
        self.leader = False
        self.metrics.is_leader.set(0)

    async def _step_down_and_release(self) -> None:
        self._step_down("shutting down")
        if self._lease is not None:
            await self._lease.release()

    # ------------------------------------------------------------------ decide

    def _may_write(self) -> bool:
        return self.leader and self._lease is not None and self._lease.valid()

    async def _decide_loop(self, js: JetStreamContext) -> None:
        tick = self.cfg.controller.tick_interval
        changed = self.fold.changed
        await self.caught_up.wait()
        while not self._stopping:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # races with the event, and this loop would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await changed.wait()
            changed.clear()
            self._observe()
            if not self._may_write():
                continue
            assert self._appender is not None
            if self.fold.state.last_seq < self._appender.awaited:
                continue  # our own appends are not folded yet: deciding now would repeat them
            started = time.perf_counter()
            decisions = decide(self.fold.state, self.cfg, self.clock(), source=f"controller/{self.id}")
            self.metrics.decide_seconds.observe(time.perf_counter() - started)
            if decisions:
                await self._appender.append(decisions, self._may_write)
            await self._maybe_checkpoint(js)

    async def _maybe_checkpoint(self, js: JetStreamContext) -> None:
        state = self.fold.state
        if state.last_seq - self.checkpoint_seq < self.cfg.controller.checkpoint_every:
            return
        try:
            await save_checkpoint(js, self.checkpoint_key, state)
        except StreamsError as exc:
            log.warning("checkpoint at seq %d failed: %s", state.last_seq, exc)
            return
        self.checkpoint_seq = state.last_seq
        self.metrics.checkpoints.inc()

    def _observe(self) -> None:
        m, s = self.metrics, self.fold.state
        m.last_seq.set(s.last_seq)
        m.lag.set(self.fold.lag)
        m.nodes.set(len(s.nodes))
        m.instances.clear()
        for inst in s.instances.values():
            m.instances.labels(inst.spec.role.value, inst.state.value).inc()
        m.open_faults.clear()
        for f in s.faults.values():
            m.open_faults.labels(f.data.level.value).inc()
        m.open_alarms.set(len(s.alarms))


async def _close(nc: Client) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.drain(), 5.0)
    with contextlib.suppress(Exception):
        await nc.close()
