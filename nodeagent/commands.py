"""Start/stop commands: a durable JetStream consumer on `motor.cmd.<node>.>` and their checks.

A command is acked only after it took effect and its result (`command.applied` or
`command.refused`) is in the log; until then JetStream redelivers it. Commands run one at a
time, in log order. Idempotence by command id lives in the agent (a redelivered command is
answered the same way and never runs twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from core import subjects
from core.codec import decode
from core.errors import DecodeError
from core.events import AnyEvent, EndpointSpec, Role, StartCommand, StartCommandData, StopCommand
from nodeagent.errors import CommandRefusal
from streams.definitions import MOTOR_STREAM

log = logging.getLogger(__name__)

Handler = Callable[[StartCommand | StopCommand, int], Awaitable[None]]


def durable_name(node_id: str) -> str:
    return f"nodeagent-{subjects.check_token(node_id, 'node id')}"


def check_start(
    cmd: StartCommandData,
    *,
    node_id: str,
    job_name: str,
    role: Role,
    engine_type: str,
    registered: tuple[EndpointSpec, ...],
) -> None:
    """Raise CommandRefusal when a start command does not fit this node."""
    if cmd.node_id != node_id:
        raise CommandRefusal("wrong_node", f"command is for node {cmd.node_id!r}, this is {node_id!r}")
    if cmd.job_name != job_name:
        raise CommandRefusal(
            "job_mismatch", f"command job_name {cmd.job_name!r} does not match this node's job {job_name!r}"
        )
    if cmd.role != role:
        raise CommandRefusal("role_mismatch", f"command role {cmd.role.value!r}, this node is {role.value!r}")
    if cmd.engine_type != engine_type:
        raise CommandRefusal(
            "engine_mismatch", f"command engine_type {cmd.engine_type!r}, this node runs {engine_type!r}"
        )
    if not cmd.endpoints:
        raise CommandRefusal("bad_endpoint", "command lists no endpoints")
    mine = {e.id: e for e in registered}
    seen: set[int] = set()
    for e in cmd.endpoints:
        if e.id in seen:
            raise CommandRefusal("bad_endpoint", f"endpoint {e.id} listed twice")
        seen.add(e.id)
        reg = mine.get(e.id)
        if reg is None:
            raise CommandRefusal(
                "bad_endpoint", f"endpoint {e.id} is not registered here (have {sorted(mine)})"
            )
        if (e.ip, e.business_port) != (reg.ip, reg.business_port):
            raise CommandRefusal(
                "bad_endpoint",
                f"endpoint {e.id} at {e.ip}:{e.business_port}, registered at {reg.ip}:{reg.business_port}",
            )


class CommandConsumer:
    """Pulls this node's commands one at a time and hands them to `handle(event, stream_seq)`."""

    def __init__(
        self, js: JetStreamContext, node_id: str, handle: Handler, *, ack_wait: float = 60.0
    ) -> None:
        self.js = js
        self.node_id = node_id
        self.handle = handle
        self.ack_wait = ack_wait
        self._sub: JetStreamContext.PullSubscription | None = None
        self._stopping = False

    async def subscribe(self) -> None:
        """Create (or bind to) the durable consumer; call before registering."""
        cfg = ConsumerConfig(
            durable_name=durable_name(self.node_id),
            ack_policy=AckPolicy.EXPLICIT,
            # A new durable starts at "now": it is created before the node registers, and
            # commands of an earlier life of this node id are not this agent's business.
            deliver_policy=DeliverPolicy.NEW,
            ack_wait=self.ack_wait,
            max_ack_pending=1,
            max_deliver=-1,
            filter_subject=subjects.node_commands(self.node_id),
        )
        self._sub = await self.js.pull_subscribe(
            subjects.node_commands(self.node_id), durable=cfg.durable_name, stream=MOTOR_STREAM, config=cfg
        )

    async def run(self) -> None:
        """Fetch and handle commands until cancelled."""
        if self._sub is None:
            await self.subscribe()
        assert self._sub is not None
        # nats-py turns a cancelled fetch into a NATS error at times: the flag, not the
        # cancellation alone, ends this loop.
        while not self._stopping:
            try:
                msgs = await self._sub.fetch(1, timeout=5.0)
            except (NatsTimeoutError, TimeoutError):
                continue
            except NatsError as exc:
                if self._stopping:
                    return
                log.warning("fetching commands failed: %s; retrying", exc)
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                await self._one(msg)

    def stop(self) -> None:
        """Make `run` return at its next turn (call before cancelling it)."""
        self._stopping = True

    async def _one(self, msg: Msg) -> None:
        try:
            ev: AnyEvent = decode(msg.data)
        except DecodeError as exc:
            log.warning("undecodable command on %s dropped: %s", msg.subject, exc)
            await msg.term()
            return
        if not isinstance(ev, StartCommand | StopCommand):
            log.warning("%s on %s is not a command; ignored", ev.type, msg.subject)
            await msg.ack()
            return
        keepalive = asyncio.create_task(self._keepalive(msg))
        try:
            await self.handle(ev, msg.metadata.sequence.stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("command %s failed; it will be redelivered", ev.data.command_id)
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
            return
        finally:
            keepalive.cancel()
        await msg.ack_sync()

    async def _keepalive(self, msg: Msg) -> None:
        # A stop may take stop_grace seconds: keep the message ours meanwhile.
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
