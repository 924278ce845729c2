"""Start/stop commands: a durable JetStream consumer on `motor.cmd.<node>.>` and their checks.

A command is acked only after it took effect and its result (`command.applied` or
`command.refused`) is in the log; until then JetStream redelivers it. Commands run one at a
time, in log order. Idempotence by command id lives in the agent (a redelivered command is
answered the same way and never runs twice).

Nothing NATS does ends the consumer: a fetch that fails checks the durable consumer and makes
it again when it is gone (the stream was deleted and made again); an ack, nak or term that
times out is retried until the message's ack wait has passed (then JetStream redelivers it and
the agent answers it from memory). A command whose handling fails is delivered again after a
growing delay, `attempts` times in all, then refused (`handler_failed`) and terminated, so it
never holds up the node's later commands. An undecodable message is terminated and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from core import subjects
from core.codec import decode
from core.errors import DecodeError
from core.events import AnyEvent, EngineOpCommand, StartCommand, StopCommand
from nodeagent.errors import Refusal
from nodeagent.metrics import AgentMetrics
from streams.definitions import MOTOR_STREAM
from streams.errors import StreamsError
from streams.log import Durable, Log, Message
from streams.permissions import durable_name  # NATS permissions name it too

log = logging.getLogger(__name__)

Command = StartCommand | StopCommand | EngineOpCommand
Handler = Callable[[Command, int], Awaitable[None]]
# refuse(command, refusal): publish its `command.refused` and remember the outcome.
Refuser = Callable[[Command, Refusal], Awaitable[None]]

FETCH_WAIT = 5.0
ACK_TIMEOUT = 2.0
# A consumer made again replays from a little before it was last seen (clocks of the agent
# and the server differ); what it replays twice is answered from memory.
REMADE_MARGIN = 5.0


class CommandConsumer:
    """Pulls this node's commands one at a time and hands them to `handle(event, stream_seq)`."""

    def __init__(
        self,
        motor: Log,
        node_id: str,
        handle: Handler,
        refuse: Refuser,
        metrics: AgentMetrics,
        *,
        ack_wait: float = 60.0,
        attempts: int = 3,
        retry_delay: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.motor = motor
        self.clock = clock
        self.monotonic = monotonic
        self.node_id = node_id
        self.durable = durable_name(node_id)
        self.handle = handle
        self.refuse = refuse
        self.metrics = metrics
        self.ack_wait = ack_wait
        self.attempts = attempts
        self.retry_delay = retry_delay
        self._sub: Durable | None = None
        self._stopping = False
        self._alive_at: float | None = None  # wall clock when the durable was last known to exist

    async def subscribe(self, since: float | None = None) -> None:
        """Create (or bind to) the durable consumer; call before registering.

        A new durable delivers what is published from now on: it is made before the node
        registers, and commands of an earlier life of this node id are not this agent's
        business. Made again after it vanished (`since`), what was published since it was last
        seen is ours (a command seen before is answered from memory). Every delivery may be
        redelivered (attempts are counted here, so a refusal is logged).
        """
        self._sub = await self.motor.durable(
            MOTOR_STREAM,
            self.durable,
            filter_subject=subjects.node_commands(self.node_id),
            ack_wait=self.ack_wait,
            max_ack_pending=1,
            start_time=since - REMADE_MARGIN if since is not None else None,
        )
        self._alive_at = self.clock()

    async def run(self) -> None:
        """Fetch and handle commands until `stop` is called."""
        # nats-py turns a cancelled fetch into a NATS error at times: the flag, not the
        # cancellation alone, ends this loop.
        while not self._stopping:
            if self._sub is None:
                await self._remake()
                continue
            try:
                msgs = await self._sub.fetch(FETCH_WAIT)
            except StreamsError as exc:
                if self._stopping:
                    return
                await self.on_fetch_failed(exc)
                continue
            if not msgs:
                if self.motor.connected:
                    self._alive_at = self.clock()  # the server held our pull: the consumer exists
                continue
            self._alive_at = self.clock()
            for msg in msgs:
                await self._one(msg)

    def stop(self) -> None:
        """Make `run` return at its next turn (call before cancelling it)."""
        self._stopping = True

    async def on_fetch_failed(self, exc: Exception) -> None:
        """A fetch failed: make the durable consumer again if it is gone, else pause a moment."""
        assert self._sub is not None
        try:
            exists = await self._sub.exists()
        except (StreamsError, TimeoutError) as info_exc:
            log.warning("fetching commands failed (%s); consumer check failed too (%s)", exc, info_exc)
        else:
            if not exists:
                log.warning("command consumer %s is gone (%s): making it again", self.durable, exc)
                await self._remake()
                return
            log.warning("fetching commands failed: %s; retrying", exc)
        await asyncio.sleep(1.0)

    async def _remake(self) -> None:
        old, self._sub = self._sub, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        since = self._alive_at
        try:
            await self.subscribe(since=since)
        except (StreamsError, TimeoutError) as exc:
            log.warning("cannot make command consumer %s yet: %s; retrying in 1s", self.durable, exc)
            await asyncio.sleep(1.0)
            return
        self.metrics.consumer_remade.labels(self.node_id).inc()
        log.warning("command consumer %s made again (commands since %s)", self.durable, _clock(since))

    async def _one(self, msg: Message) -> None:
        seq = msg.seq
        try:
            ev: AnyEvent = decode(msg.data)
        except DecodeError as exc:
            log.warning("undecodable command at seq %d on %s terminated: %s", seq, msg.subject, exc)
            self.metrics.commands_rejected.labels(self.node_id, "undecodable").inc()
            await self._settle(msg, "term", seq)
            return
        if not isinstance(ev, StartCommand | StopCommand | EngineOpCommand):
            log.warning("%s at seq %d on %s is not a command; terminated", ev.type, seq, msg.subject)
            self.metrics.commands_rejected.labels(self.node_id, "not_a_command").inc()
            await self._settle(msg, "term", seq)
            return
        keepalive = asyncio.create_task(self._keepalive(msg))
        failed: Exception | None = None
        try:
            await self.handle(ev, seq)
        except Exception as exc:
            failed = exc
        finally:
            keepalive.cancel()
        if failed is not None:
            await self.on_handler_failed(msg, ev, seq, failed)
        else:
            await self._settle(msg, "ack", seq)

    async def on_handler_failed(self, msg: Message, ev: Command, seq: int, exc: Exception) -> None:
        """Deliver again after a growing delay; after `attempts` deliveries refuse and terminate."""
        cid = ev.data.command_id
        delivered = msg.delivered
        what = f"{type(exc).__name__}: {exc}"
        self.metrics.command_failures.labels(self.node_id).inc()
        if delivered < self.attempts:
            delay = self.retry_delay * 2 ** (delivered - 1)
            log.warning(
                "command %s at seq %d failed (attempt %d of %d): %s; delivered again in %.1fs",
                cid, seq, delivered, self.attempts, what, delay,
            )  # fmt: skip
            await self._settle(msg, "nak", seq, delay)
            return
        log.error("command %s at seq %d failed %d times; refusing it", cid, seq, delivered, exc_info=exc)
        self.metrics.commands_rejected.labels(self.node_id, "handler_failed").inc()
        try:
            async with asyncio.timeout(self.ack_wait / 2):
                why = Refusal(
                    code="handler_failed", reason=f"handling failed {delivered} times, last: {what}"
                )
                await self.refuse(ev, why)
        except Exception as refuse_exc:
            log.error("command %s at seq %d: its refusal was not published either: %s", cid, seq, refuse_exc)
        await self._settle(msg, "term", seq)

    async def _settle(self, msg: Message, how: str, seq: int, delay: float | None = None) -> None:
        """Ack, nak or term `msg`, retried while NATS does not answer; never raises.

        Given up after the ack wait: JetStream has redelivered the message by then, and the
        agent answers a command it has seen the same way again.
        """
        deadline = self.monotonic() + self.ack_wait
        pause = 0.2
        while True:
            try:
                if how == "ack":
                    await msg.ack(ACK_TIMEOUT)
                elif how == "nak":
                    await msg.nak(delay=delay)
                else:
                    await msg.term()
                return
            except (StreamsError, TimeoutError, OSError) as exc:
                if self._stopping or self.monotonic() + pause >= deadline:
                    self.metrics.command_ack_failures.labels(self.node_id).inc()
                    log.warning(
                        "command at seq %d: %s failed (%s); JetStream redelivers it, answered again",
                        seq, how, exc or type(exc).__name__,
                    )  # fmt: skip
                    return
                log.info("command at seq %d: %s failed (%s); retrying", seq, how, exc or type(exc).__name__)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _keepalive(self, msg: Message) -> None:
        # A stop may take stop_grace seconds: keep the message ours meanwhile.
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.close()


def _clock(ts: float | None) -> str:
    return "now" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S UTC")
