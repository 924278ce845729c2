"""The controller shell: fold MOTOR and MOTOR_HB, hold or wait for the lease, decide, append.

Start-up is checkpoint + tail. Every controller follows the log live (a hot standby, through
`streams.livefold.LiveFold`); only the lease holder decides, after it has folded everything
the stream held when it won the lease, and announces itself with `controller.leader_changed`
(whose sequence fences every decision it appends, controller.appender).

Nothing here ends the process but `stop`: NATS slow or away is waited out (every call is
retried or skipped for this tick), a lost log is folded again from what MOTOR holds now
(`_on_log_lost`), a poison event is skipped, and a loop that fails on a bug is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from controller.appender import Appender, Outcome
from controller.decide import decide
from controller.fold import Fold
from controller.heard import Hearing
from controller.hearing import HeartbeatPath
from controller.leadership import Leadership
from controller.metrics import ControllerMetrics
from core.ageout import max_age_seconds, restate_due
from core.config import ClusterConfig
from core.state import ClusterState
from streams.checkpoint import Origin, load_checkpoint_origin, save_checkpoint
from streams.connection import NatsOptions, connect
from streams.definitions import HB_STREAM, MOTOR_STREAM
from streams.errors import CorruptCheckpoint
from streams.jetstream import JetStreamLog
from streams.livefold import LiveFold
from streams.log import Log
from streams.lostlog import Loss, stale_checkpoint
from streams.poison import Skipped
from streams.reader import Record
from streams.retry import until_done

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
        log: Log | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`log`: the log to run on (default: connect to NATS at `nats_urls` when run); `clock`
        and `monotonic`: wall and steady time (the simulator gives its own, tests/sim)."""
        self.cfg = cfg
        self.id = controller_id
        self.nats_urls = nats_urls
        self.clock = clock
        self.monotonic = monotonic
        self.checkpoint_key = checkpoint_key
        self._given_log = log
        self.metrics = ControllerMetrics(controller_id)
        self._motor_folded = self.metrics.events.labels(MOTOR_STREAM)
        self._hb_folded = self.metrics.events.labels(HB_STREAM)
        self.fold = Fold(clock=clock, monotonic=monotonic)
        self.caught_up = asyncio.Event()  # the LiveFold's: cleared while a lost log is folded again
        self.started = asyncio.Event()
        self.checkpoint_seq = 0
        self._checkpoint_at = monotonic()  # steady time of the last checkpoint (or of the start)
        self.log: LiveFold | None = None
        self.leadership: Leadership | None = None
        self.heartbeat_path: HeartbeatPath | None = None  # whether heartbeats can land at all
        self._appender: Appender | None = None
        self._stream_created: str | None = None
        self._event_ts: float | None = None  # ts of the last MOTOR event folded (checkpoint origin)
        # The instances and faults the gauges were last counted from (`_observe`).
        self._observed: tuple[object, object] = (None, None)

    @property
    def state(self) -> ClusterState:
        return self.fold.state

    @property
    def leader(self) -> bool:
        return self.leadership is not None and self.leadership.leader

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

    def hearing_since(self) -> float:
        """Since when this controller could hear heartbeats (reconnect, catch-up, takeover),
        on its monotonic clock like every figure of `hearing`.

        Now, while it cannot hear at all (NATS away, a consumer being recreated): a deaf
        controller judges nobody silent.
        """
        if self.log is None or not self.log.hearing:
            return self.monotonic()
        path = self.heartbeat_path
        if path is not None and path.down:
            return self.monotonic()  # heartbeats cannot land (the stream elects a leader)
        took = self.leadership.took_over_at if self.leadership is not None else 0.0
        back = path.back_since if path is not None else 0.0
        return max(self.log.hearing_since, took, back)

    def heard_until(self) -> float | None:
        """The last moment heartbeats are known to have been able to land (None: now)."""
        path = self.heartbeat_path
        return path.answered_asked_at if path is not None else None

    def hearing(self) -> Hearing:
        """What decide judges silence on: monotonic readings only, so no machine's wall clock
        (the nodes' in their heartbeats, ours stepping) moves anyone (controller.heard)."""
        return Hearing(
            now=self.monotonic(),
            since=self.hearing_since(),
            until=self.heard_until(),
            at=dict(self.fold.heard_at),
        )

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; then give the lease up and close the connection."""
        ctrl = self.cfg.controller
        async with AsyncExitStack() as stack:
            motor = self._given_log
            if motor is None:
                opts = NatsOptions.from_config(self.cfg.nats, self.nats_urls)
                # Waits for NATS as long as it takes: a controller started before NATS is not a crash.
                nc = await connect(opts, name=f"motor-controller-{self.id}", retry_initial=True)
                motor = JetStreamLog(nc)
                stack.push_async_callback(_close, motor)
            await until_done(
                "ensure the streams",
                lambda: motor.ensure_streams(self.cfg.nats, lease_ttl=ctrl.lease_ttl),
                log,
            )
            await until_done("load the checkpoint", lambda: self._load_checkpoint(motor), log)
            self._appender = Appender(motor, self.fold, self.metrics)
            lead = self.leadership = Leadership(
                motor,
                self.id,
                self.fold,
                self._appender,
                self.metrics,
                ttl=ctrl.lease_ttl,
                clock=self.clock,
                monotonic=self.monotonic,
            )
            stack.push_async_callback(lead.release)
            start = self.fold.state.last_seq + 1 if self.fold.state.last_seq else None
            self.log = lead.log = LiveFold(
                motor,
                self._fold_motor,
                start_seq=start,
                heartbeats=self._fold_hb,
                on_lost=self._on_log_lost,
                on_skip=self._on_skip,
                name=f"controller/{self.id}",
                caught_up=self.caught_up,
                clock=self.monotonic,  # its `hearing_since` is a figure of `hearing`
            )
            await self.log.start()
            stack.push_async_callback(self.log.close)
            path = self.heartbeat_path = HeartbeatPath(motor, self.monotonic)
            loops = [
                asyncio.create_task(_forever("lease", lambda: lead.run(self.caught_up)), name="lease"),
                asyncio.create_task(_forever("heartbeat path", path.run), name="heartbeat-path"),
                asyncio.create_task(_forever("decide", lambda: self._decide_loop(motor)), name="decide"),
            ]
            self.started.set()
            try:
                await stop.wait()
            finally:
                for t in loops:
                    t.cancel()
                _, stuck = await asyncio.wait(loops, timeout=10.0)
                if stuck:
                    log.error("tasks did not stop: %s", ", ".join(t.get_name() for t in stuck))

    async def _load_checkpoint(self, motor: Log) -> None:
        try:
            found = await load_checkpoint_origin(motor, self.checkpoint_key)
        except CorruptCheckpoint as exc:  # any other StreamsError is NATS trouble: tried again
            log.warning("checkpoint unusable (%s); replaying the whole log", exc)
            found = None
        view = await motor.stream_info(MOTOR_STREAM)
        self._stream_created = view.created
        state: ClusterState | None = None
        if found is not None:
            state, origin = found
            why = stale_checkpoint(
                state.last_seq, view, stream_created=origin.stream_created, event_ts=origin.event_ts
            )
            if why is not None:
                # New events reuse or follow those sequences, and the checkpoint tells of a past
                # the log no longer has. The log wins: nodes re-register with what they run and
                # lost instances are re-adopted.
                log.warning("checkpoint set aside, replaying %s instead: %s", MOTOR_STREAM, why)
                state = None
            else:
                self._event_ts = origin.event_ts
        if state is not None:
            log.info(
                "checkpoint at seq %d: %d nodes, %d instances",
                state.last_seq,
                len(state.nodes),
                len(state.instances),
            )
            self.checkpoint_seq = state.last_seq
        self.fold.reset(state)

    # ------------------------------------------------------------------ fold hooks

    def _fold_motor(self, rec: Record) -> None:
        self.fold.motor(rec)
        self._event_ts = rec.event.ts
        self._motor_folded.inc()

    def _fold_hb(self, rec: Record) -> None:
        self.fold.heartbeat(rec)
        self._hb_folded.inc()
        # Replayed at start-up, heartbeats are old, not late. Measured from the stream's stamp,
        # as the coordinator does: the node's `ts` is its own clock, which may be off by hours.
        if rec.appended and self.caught_up.is_set():
            self.metrics.hb_lag.observe(max(0.0, self.clock() - rec.appended))

    def _on_skip(self, skipped: Skipped) -> None:
        self.metrics.skipped.labels(skipped.reason).inc()

    async def _on_log_lost(self, reason: Loss) -> None:
        """`on_log_lost`: the log lost what was folded; rebuild from what MOTOR holds now.

        The leader stops deciding (its fence and positions belong to the old log) but keeps
        its lease, and announces itself again once the new fold has caught up; every node gets
        the heartbeat grace from then on, and node agents re-register what they run.
        """
        self.metrics.log_lost.inc()
        log.warning("the log lost what was folded (%s): rebuilding the state from %s", reason, MOTOR_STREAM)
        if self.leadership is not None:
            self.leadership.remember_terms()
            self.leadership.step_down("the log was lost; announcing again once folded")
        if self._appender is not None:
            self._appender.reset()
        self.fold.reset()
        self.checkpoint_seq = 0
        self._stream_created = self.log.last_view.created if self.log and self.log.last_view else None
        self._event_ts = None

    # ------------------------------------------------------------------ decide

    async def _decide_loop(self, motor: Log) -> None:
        tick = self.cfg.controller.tick_interval
        changed = self.fold.changed
        lead, appender, livefold = self.leadership, self._appender, self.log
        assert lead is not None and appender is not None and livefold is not None
        while True:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # races with the event, and this loop would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await changed.wait()
            changed.clear()
            self._observe()
            if not self.caught_up.is_set() or not lead.may_write() or not livefold.checked:
                continue  # (not checked: the fold may hold a fact a lost tail took; asked first)
            if livefold.position < appender.awaited:
                continue  # our own appends are not folded yet: deciding now would repeat them
            if await lead.outrank():
                continue  # decide once the newer reign is folded: commands carry its term
            started = time.perf_counter()
            decisions = decide(
                self.fold.state,
                self.cfg,
                self.clock(),
                source=f"controller/{self.id}",
                hearing=self.hearing(),
            )
            self.metrics.decide_seconds.observe(time.perf_counter() - started)
            if decisions and await appender.append(decisions, lead.may_write) is Outcome.FENCED:
                lead.deposed()
            await self._maybe_checkpoint(motor)

    async def _maybe_checkpoint(self, motor: Log) -> None:
        """Every `checkpoint_every` events, and on a quiet log before MOTOR's age-out: a
        controller that starts later must find the commands that aged out (a fold of the log
        alone would send each instance's start again)."""
        state = self.fold.state
        new = state.last_seq - self.checkpoint_seq
        aging = new > 0 and restate_due(self._checkpoint_at, self.monotonic(), max_age_seconds(self.cfg.nats))
        if new < self.cfg.controller.checkpoint_every and not aging:
            return
        try:
            await save_checkpoint(
                motor, self.checkpoint_key, state, Origin(self._stream_created, self._event_ts)
            )
        except Exception as exc:  # NATS slow or away: a later tick saves it
            log.warning("checkpoint at seq %d failed: %s", state.last_seq, exc)
            return
        self.checkpoint_seq = state.last_seq
        self._checkpoint_at = self.monotonic()
        self.metrics.checkpoints.inc()

    def _observe(self) -> None:
        m, s = self.metrics, self.fold.state
        m.last_seq.set(s.last_seq)
        m.lag.set(self.fold.lag)
        m.nodes.set(len(s.nodes))
        if self.log is not None:
            h = self.log.health()
            m.following.set(int(h.connected and h.following))
        if s.instances is not self._observed[0] or s.faults is not self._observed[1]:
            # Rebuilt only when they changed (the maps are immutable, so the same map is the same
            # content): each tick's rebuild was most of this, for gauges a heartbeat never moves.
            self._observed = (s.instances, s.faults)
            m.instances.clear()
            for inst in s.instances.values():
                m.instances.labels(inst.spec.role.value, inst.state.value).inc()
            m.open_faults.clear()
            for f in s.faults.values():
                m.open_faults.labels(f.data.level.value).inc()
        m.open_alarms.set(len(s.alarms))


async def _forever(name: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Run a loop that should never end; if it fails anyway (a bug), log it and run it again."""
    while True:
        try:
            await loop()
            log.error("%s loop ended; starting it again", name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s loop failed; starting it again in 1s", name)
        await asyncio.sleep(1.0)


async def _close(motor: Log) -> None:
    with contextlib.suppress(Exception):
        await motor.close()
