"""LiveFold: follow MOTOR (and optionally MOTOR_HB) into a caller's fold for as long as it runs.

The one place where a long-lived reader of the log meets every fault, so the controller, the
coordinator, the node agent's resync observer and `motor up`'s live view handle each once:

- **outage** (NATS away, frozen, restarted; any length): the consumer is recreated where the
  fold stopped, for ever; nothing ends. Each time delivery works again `hearing_since` moves
  (`after_reconnect`), so a caller that judges silence can give nodes a grace.
- **stream away** (`StreamMissing`, e.g. while JetStream restores after a restart, or between
  a delete and a create): wait; resume when it is back, as the same stream or a new one.
- **lost log** (purged, deleted and created again, rewound; see `streams.lostlog`): the fold
  starts over from the stream's start after calling `on_lost(loss)` (a `Loss`: kind and
  sentence), so the caller can rebuild its state from what the log holds now (`on_log_lost`).
- **poison** (undecodable, unknown type, newer schema, inapplicable: the apply callback
  raised): skipped, counted by reason, logged once with stream and sequence
  (`streams.poison`); the fold goes on.

Apply callbacks are synchronous and run in stream order; `position` is the sequence of the
last MOTOR message handled (applied or skipped), which is what `wait_for` waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging

from nats.errors import Error as NatsError

from streams.definitions import HB_STREAM
from streams.errors import StreamsError
from streams.foldlanes import LaneFold
from streams.foldparts import Lane
from streams.log import Delivery, Range, StreamMissing
from streams.lostlog import Loss, StreamView, overwritten

log = logging.getLogger(__name__)


class LiveFold(LaneFold):
    """Ordered consumption of MOTOR (optionally filtered) and MOTOR_HB into apply callbacks,
    and the watcher that checks each stream is there and still holds what was folded."""

    async def start(self) -> None:
        """Begin following (returns at once; an unreachable NATS only delays delivery)."""
        self._motor.task = asyncio.create_task(self._run(self._motor), name=f"{self.name}-{self.stream}")
        if self._hb is not None:
            self._hb.task = asyncio.create_task(self._run(self._hb), name=f"{self.name}-{HB_STREAM}")
        self._watch_task = asyncio.create_task(self._watch(), name=f"{self.name}-watch")

    # ------------------------------------------------------------------ watch

    async def _watch(self) -> None:
        tick = 0
        while not self._closed:
            if not self.log.connected:  # a request now would only queue in the client
                await asyncio.sleep(self.check_interval)
                continue
            try:
                await self._after_reconnect()
                await self._check_motor()
                if self._hb is not None and (tick % 3 == 0 or self._hb.away):
                    await self._check_hb(self._hb)
            except asyncio.CancelledError:
                raise
            except (StreamsError, NatsError, OSError, TimeoutError) as exc:
                log.debug("%s: stream check failed: %s", self.name, exc)
            except Exception:
                log.exception("%s: stream check failed", self.name)
            tick += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.check_interval):
                    await self._poke.wait()
            self._poke.clear()

    async def _after_reconnect(self) -> None:
        """`after_reconnect`: make again every consumer made before the last reconnect
        (resuming after what was folded)."""
        n = self.log.reconnects
        for lane in (self._motor, self._hb):
            if lane is not None and lane.consumer is not None and not lane.away and lane.reconnects != n:
                log.info("%s: reconnected; making the %s consumer again", self.name, lane.stream)
                await self._restart_lane(lane)

    async def _info(self, stream: str) -> StreamView | None:
        try:
            return await self.log.stream_info(stream)
        except StreamMissing:
            return None

    async def _check_motor(self) -> None:
        lane = self._motor
        # The position before the question: an event folded while the answer travels is newer
        # than the server's view, and must not read as a rewound log.
        folded = self.position
        view = await self._info(lane.stream)
        if view is None:
            if not lane.missing:
                log.warning("%s: stream %s is missing; waiting for it", self.name, lane.stream)
            lane.missing = True
            return
        lane.missing = False
        self.last_view = view
        if lane.created is None:
            lane.created = view.created
        reason = self.detector.observe(view, folded)
        if (
            reason is None
            and folded
            and not self._position_ts_ns
            and view.first_seq <= folded <= view.last_seq
        ):
            # Started from a checkpoint: learn the stream time of the message it starts after,
            # or a reconnect could not check it (a standby back from a checkpoint took over on
            # a fold whose tail the log had lost and written over; tests/sim seed 986).
            stored = await self._stored(lane.stream, folded)
            if stored is not None and folded == self.position and not self._position_ts_ns:
                self._position_ts_ns = stored.ts_ns
        if reason is None and self._recheck is not None:
            seq, ts_ns = self._recheck
            if view.first_seq <= seq <= view.last_seq:
                stored = await self._stored(lane.stream, seq)
                reason = overwritten(seq, ts_ns, stored.ts_ns if stored is not None else None)
            if self._recheck == (seq, ts_ns):  # answered (a failed question asks again)
                self._recheck = None
        if reason is not None:
            await self._log_lost(reason, view)
        elif lane.away:
            log.info("%s: stream %s is back; resuming after seq %d", self.name, lane.stream, self.position)
            lane.back.set()

    async def _stored(self, stream: str, seq: int) -> Delivery | None:
        """The message the stream holds at `seq`, asked as this fold may ask: a filtered fold's
        reader may read only what its filter takes (a node agent reads events, never another
        node's commands, so it may not get a message by sequence), and reads it through its
        filter; None when what is there is not the fold's."""
        if self.filter_subject is None:
            return await self.log.message(stream, seq)
        span = Range(start_seq=seq, until_seq=seq, filter_subject=self.filter_subject)
        found: Delivery | None = None
        async for batch in self.log.read(stream, span):  # one message at most: read it to its end
            for d in batch:
                if d.seq == seq:
                    found = d
        return found

    async def _check_hb(self, lane: Lane) -> None:
        view = await self._info(lane.stream)
        if view is None:
            return
        created = view.created
        if lane.created is None:
            lane.created = created
        elif created != lane.created:
            # Heartbeats carry no history worth keeping: read the new stream from its start.
            log.warning("%s: stream %s was created again; reading it from its start", self.name, lane.stream)
            lane.created = created
            await self._restart_lane(lane)
            return
        if lane.away:
            lane.back.set()

    async def _log_lost(self, reason: Loss, view: StreamView) -> None:
        """`on_log_lost`: start the fold over from the start of what the stream holds now."""
        self.lost += 1
        log.warning(
            "%s: the log lost what was folded (%s); folding %s again from its start (seq %d)",
            self.name,
            reason,
            self.stream,
            max(1, view.first_seq),
        )
        lane = self._motor
        await self._stop_lane(lane)
        self.caught_up.clear()
        lane.caught_up = False
        lane.away = False
        lane.back.clear()
        lane.created = view.created
        self.position = 0
        self._position_ts_ns = 0
        self._recheck = None
        self.start_seq = None
        self.detector.reset(view)
        if self.on_lost is not None:
            try:
                res = self.on_lost(reason)
                if inspect.isawaitable(res):
                    await res
            except Exception:
                log.exception("%s: on_lost failed", self.name)
        if not self._closed:
            lane.task = asyncio.create_task(self._run(lane), name=f"{self.name}-{lane.stream}")
