"""The consuming half of a `LiveFold` (`streams.livefold`): its lanes, one ordered consumer per
followed stream (MOTOR, optionally filtered, and MOTOR_HB), folded in stream order into the
caller's apply callbacks.

A lane's consumer that fails is made again after a pause, resuming after the last message
handled, for ever; a stream away makes the lane wait until the watcher says it is back. Poison
(undecodable, unknown type, newer schema, inapplicable: the apply callback raised) is skipped,
counted by reason and logged once with stream and sequence (`streams.poison`). `position` is
the sequence of the last MOTOR message handled (applied or skipped), which `wait_for` waits
on. What the watcher decides from the streams it checks (a lane made again, the fold started
over after a lost log) is `LiveFold`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from nats.errors import Error as NatsError

from core.codec import decode
from core.errors import DecodeError
from streams.definitions import HB_STREAM, MOTOR_STREAM
from streams.errors import StreamsError
from streams.foldparts import FoldHealth, Lane
from streams.log import Delivery, Log, Ordered, StreamMissing, StreamReplaced
from streams.lostlog import Loss, LossDetector, StreamView
from streams.poison import SkipLog, Skipped
from streams.reader import Record

log = logging.getLogger(__name__)

Apply = Callable[[Record], None]
OnLost = Callable[[Loss], Awaitable[None] | None]

RETRY_MAX = 2.0  # longest pause before a consumer is tried again after an unexpected error


class LaneFold:
    """Ordered consumption of MOTOR (optionally filtered) and MOTOR_HB into apply callbacks;
    `LiveFold` adds the watcher that checks the streams."""

    def __init__(
        self,
        log: Log,
        apply: Apply,
        *,
        stream: str = MOTOR_STREAM,
        start_seq: int | None = None,
        filter_subject: str | None = None,
        heartbeats: Apply | None = None,
        on_lost: OnLost | None = None,
        on_skip: Callable[[Skipped], None] | None = None,
        check_interval: float = 2.0,
        idle_heartbeat: float = 2.0,
        clock: Callable[[], float] = time.time,
        name: str = "fold",
        caught_up: asyncio.Event | None = None,
    ) -> None:
        self.log = log
        self.apply = apply
        self.stream = stream
        self.start_seq = start_seq
        self.filter_subject = filter_subject
        self.heartbeats = heartbeats
        self.on_lost = on_lost
        self.check_interval = check_interval
        self.idle_heartbeat = idle_heartbeat
        self.clock = clock
        self.name = name
        self.skips = SkipLog(on_skip=on_skip)
        # Set once what the streams held at (re)start is folded; cleared while the fold starts
        # over after a lost log. A caller may pass its own event to be set.
        self.caught_up = caught_up if caught_up is not None else asyncio.Event()
        # Whether the fold has ever caught up: a caller serving from what it folded keeps
        # serving across a lost log, while `caught_up` is clear again.
        self.caught_up_once = False
        # A fold started after a checkpoint has handled what the checkpoint holds: a takeover's
        # `wait_for(last_seq)` must not wait for an event a quiet log never appends.
        self.position = start_seq - 1 if start_seq else 0
        self._position_ts_ns = 0  # stream time of the message at `position` (0: not known)
        self._recheck: tuple[int, int] | None = None  # (seq, ts) to find in the stream after a restart
        self._poke = asyncio.Event()  # wakes the watcher before its interval is up
        self.hearing_since = 0.0
        self.lost = 0
        self.last_view: StreamView | None = None
        self.detector = LossDetector()
        self._motor = Lane(stream)
        self._hb = Lane(HB_STREAM) if heartbeats is not None else None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._watch_task: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ public

    async def wait_for(self, seq: int, within: float) -> bool:
        """Wait until MOTOR is handled up to `seq` (a message this fold's filter matches); False on timeout."""
        if self.position >= seq:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, fut))
        try:
            async with asyncio.timeout(within):
                await fut
        except TimeoutError:
            return False
        finally:
            fut.cancel()  # a no-op when resolved; drops a waiter that timed out
        return True

    @property
    def checked(self) -> bool:
        """No check of the fold against the stream is pending: after a reconnect (perhaps a
        server restart that lost the stream's tail) the MOTOR consumer is made again and the
        message folded last looked up first. A decider waits for it rather than decide on a
        fact the log may have lost (found by the simulator, tests/sim, seeds 142 and 266)."""
        return self._recheck is None and self._motor.reconnects == self.log.reconnects

    @property
    def skipped(self) -> dict[str, int]:
        """Events skipped so far, by reason."""
        return dict(self.skips.by_reason)

    @property
    def hearing(self) -> bool:
        """Connected, every consumer delivering, and made since the last reconnect: silence now
        is the producers', not ours. A consumer from before a reconnect may be dead without
        knowing it yet (a server restart takes ordered consumers along; it notices after three
        idle heartbeats): until the watcher has made them again (`after_reconnect`), nothing
        heard or not heard counts."""
        n = self.log.reconnects
        return self.log.connected and all(
            x.delivering and x.reconnects == n for x in (self._motor, self._hb) if x is not None
        )

    def health(self) -> FoldHealth:
        """A snapshot of connection, position, lag, skips, resets and lost-log restarts."""
        lanes = [x for x in (self._motor, self._hb) if x is not None]
        view = self.last_view
        last = view.last_seq if view is not None else 0
        return FoldHealth(
            connected=self.log.connected,
            following=self.hearing,
            caught_up=self.caught_up.is_set(),
            position=self.position,
            stream_last_seq=last,
            lag=max(0, last - self.position),
            skipped=self.skipped,
            resets=sum(x.resets + (x.consumer.resets if x.consumer else 0) for x in lanes),
            lost=self.lost,
            hearing_since=self.hearing_since,
        )

    async def close(self) -> None:
        """Stop following and delete the consumers."""
        self._closed = True
        tasks = [t for t in (self._watch_task, self._motor.task, self._hb.task if self._hb else None) if t]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # ------------------------------------------------------------------ lanes

    async def _run(self, lane: Lane) -> None:
        delay = 0.1
        while not self._closed:
            pc = self._consumer(lane)
            try:
                pending = await pc.start()
                if pending == 0:
                    self._lane_caught_up(lane)
                while batch := await pc.next_batch():
                    if lane is self._motor:
                        self._fold_motor(batch)
                    else:
                        self._fold_hb(batch)
                    delay = 0.1
            except asyncio.CancelledError:
                await self._close_consumer(lane, pc)
                raise
            except (StreamMissing, StreamReplaced) as exc:
                # The watcher tells a stream that is back as itself from a new one (lost log).
                if not lane.away and not lane.missing:
                    log.warning("%s: %s; waiting for it", self.name, exc)
                lane.away = True
                lane.back.clear()
                await self._close_consumer(lane, pc)
                await lane.back.wait()
                continue
            except (StreamsError, NatsError, OSError, TimeoutError) as exc:
                log.warning("%s: %s consumer failed (%s); again in %.1fs", self.name, lane.stream, exc, delay)
            except Exception:  # a bug must not end the fold: log it loudly and go on
                log.exception("%s: %s consumer failed; again in %.1fs", self.name, lane.stream, delay)
            await self._close_consumer(lane, pc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _consumer(self, lane: Lane) -> Ordered:
        if lane is self._motor:
            start = self.position + 1 if self.position else self.start_seq
            filt = self.filter_subject
        else:
            start, filt = None, None  # heartbeats: the latest per node is all there is
        pc = self.log.ordered(
            lane.stream,
            start_seq=start,
            filter_subject=filt,
            idle_heartbeat=self.idle_heartbeat,
            expect_created=lane.created,
        )
        pc.on_start = lambda pending: self._started(lane, pc)
        return pc

    def _started(self, lane: Lane, pc: Ordered) -> None:
        # `after_reconnect`: delivery works again, so silence is measured from now on.
        lane.away = False
        lane.consumer = pc
        lane.reconnects = self.log.reconnects
        self.hearing_since = self.clock()
        if lane is self._motor and self._position_ts_ns:
            # A consumer made again may follow a server restart that lost the stream's tail
            # and had it written over at once: the watcher checks the folded message is there.
            self._recheck = (self.position, self._position_ts_ns)
            self._poke.set()

    async def _close_consumer(self, lane: Lane, pc: Ordered) -> None:
        lane.resets += pc.resets
        pc.resets = 0
        if lane.consumer is pc:
            lane.consumer = None
        with contextlib.suppress(Exception):
            await pc.close()

    def _lane_caught_up(self, lane: Lane) -> None:
        if lane.caught_up:
            return
        lane.caught_up = True
        if self._motor.caught_up and (self._hb is None or self._hb.caught_up):
            self.caught_up.set()
            self.caught_up_once = True
            self.hearing_since = self.clock()
            log.info("%s: caught up with %s at seq %d", self.name, self.stream, self.position)

    def _fold_motor(self, batch: list[Delivery]) -> None:
        apply, skips, stream = self.apply, self.skips, self.stream
        for d in batch:
            try:
                ev = decode(d.data, d.subject)
            except DecodeError as exc:
                skips.decode_error(stream, d.seq, d.subject, exc)
            else:
                try:
                    apply(Record(stream, d.seq, d.subject, ev, d.ts_ns / 1e9))
                except Exception as exc:  # one inapplicable event must not stop the fold
                    skips.apply_error(stream, d.seq, d.subject, exc)
        last = batch[-1]
        self.position = last.seq
        self._position_ts_ns = last.ts_ns
        self.detector.seen(last.seq, last.ts_ns / 1e9)
        if self._waiters:
            self._wake()
        if last.pending == 0:
            self._lane_caught_up(self._motor)

    def _fold_hb(self, batch: list[Delivery]) -> None:
        apply, skips = self.heartbeats, self.skips
        assert apply is not None
        for d in batch:
            try:
                apply(Record(HB_STREAM, d.seq, d.subject, decode(d.data, d.subject), d.ts_ns / 1e9))
            except DecodeError as exc:
                skips.decode_error(HB_STREAM, d.seq, d.subject, exc)
            except Exception as exc:
                skips.apply_error(HB_STREAM, d.seq, d.subject, exc)
        if batch[-1].pending == 0 and self._hb is not None:
            self._lane_caught_up(self._hb)

    def _wake(self) -> None:
        seq = self.position
        keep = []
        for want, fut in self._waiters:
            if fut.done():
                continue
            if want <= seq:
                fut.set_result(None)
            else:
                keep.append((want, fut))
        self._waiters = keep

    async def _stop_lane(self, lane: Lane) -> None:
        if lane.task is not None:
            lane.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lane.task
            lane.task = None

    async def _restart_lane(self, lane: Lane) -> None:
        await self._stop_lane(lane)
        lane.away = False
        lane.back.clear()
        if not self._closed:
            lane.task = asyncio.create_task(self._run(lane), name=f"{self.name}-{lane.stream}")
