"""An ephemeral push consumer read in order, with the traps of issue 2 handled.

- Gaps are checked by *consumer* sequence (stream sequences have holes where messages were
  deleted); a gap, a missed idle heartbeat or a deleted consumer recreates the consumer
  from the last stream sequence seen, so the reader never skips and never repeats.
- Flow-control requests are answered when the reader reaches them in order, or delivery
  stalls; a stalled heartbeat's `Nats-Consumer-Stalled` subject is answered too.
- The subscription's pending limits are lifted: flow control bounds the backlog instead,
  and nats-py's default limit drops messages on a big replay.

Messages come out as `Delivery` tuples; decoding is the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from streams.errors import StreamsError

log = logging.getLogger(__name__)

API_TIMEOUT = 5.0
_WAKE: Any = object()  # put into the queue by close() to wake a waiting next()


class Delivery(NamedTuple):
    """One stream message as delivered: its sequences, time, subject and raw body."""

    seq: int
    pending: int  # matching messages still in the stream after this one, at delivery time
    ts_ns: int  # stream timestamp, nanoseconds since the epoch
    subject: str
    data: bytes
    headers: dict[str, str] | None


class ConsumerGone(StreamsError):
    """The stream the consumer reads does not exist."""


def _ack_fields(reply: str) -> tuple[int, int, int, int]:
    """(stream seq, consumer seq, timestamp ns, pending) from a `$JS.ACK...` reply subject."""
    tokens = reply.split(".")
    # v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
    # v2: $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]
    off = 0 if len(tokens) == 9 else 2
    return int(tokens[5 + off]), int(tokens[6 + off]), int(tokens[7 + off]), int(tokens[8 + off])


async def js_api(nc: Client, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call the JetStream API and return the response, raising StreamsError on an API error."""
    try:
        msg = await nc.request(subject, orjson.dumps(body) if body is not None else b"", timeout=API_TIMEOUT)
    except NoRespondersError:
        raise StreamsError(f"{subject}: JetStream is not enabled on this server") from None
    except (NatsTimeoutError, TimeoutError):
        raise StreamsError(f"{subject}: no answer within {API_TIMEOUT}s") from None
    resp: dict[str, Any] = orjson.loads(msg.data)
    err = resp.get("error")
    if err:
        if err.get("err_code") == 10059:  # stream not found
            raise ConsumerGone(err.get("description", "stream not found"))
        raise StreamsError(f"{subject}: {err.get('description', err)}")
    return resp


class PushConsumer:
    """Delivers a stream (or a filtered part of it) in order, from a sequence or a time."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        filter_subject: str | None = None,
        idle_heartbeat: float = 2.0,
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.start_seq = start_seq
        self.start_time = start_time
        self.filter_subject = filter_subject
        self.idle_heartbeat = idle_heartbeat
        self.last_seq = 0  # stream sequence of the last message handed out
        self.resets = 0
        self._cseq = 0  # consumer sequence of the last message handed out
        self._name: str | None = None
        self._sub: Subscription | None = None
        self._closed = False

    def _config(self, inbox: str) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "deliver_subject": inbox,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(self.idle_heartbeat * 1e9),
            "inactive_threshold": int(max(30.0, 5 * self.idle_heartbeat) * 1e9),
            "mem_storage": True,
            "num_replicas": 1,
            "replay_policy": "instant",
        }
        if self.filter_subject:
            cfg["filter_subject"] = self.filter_subject
        if self.last_seq:
            cfg["deliver_policy"] = "by_start_sequence"
            cfg["opt_start_seq"] = self.last_seq + 1
        elif self.start_seq is not None:
            cfg["deliver_policy"] = "by_start_sequence"
            cfg["opt_start_seq"] = max(1, self.start_seq)
        elif self.start_time is not None:
            cfg["deliver_policy"] = "by_start_time"
            cfg["opt_start_time"] = datetime.fromtimestamp(self.start_time, UTC).isoformat()
        else:
            cfg["deliver_policy"] = "all"
        return cfg

    async def start(self) -> int:
        """Create the consumer; return how many matching messages it has pending."""
        inbox = self.nc.new_inbox()
        # Subscribe before the consumer exists, so its first message has somewhere to go.
        self._sub = await self.nc.subscribe(inbox, pending_msgs_limit=0, pending_bytes_limit=0)
        resp = await js_api(
            self.nc,
            f"$JS.API.CONSUMER.CREATE.{self.stream}",
            {"stream_name": self.stream, "config": self._config(inbox)},
        )
        self._name = resp["name"]
        self._cseq = 0
        return int(resp.get("num_pending", 0))

    async def _reset(self, why: str) -> None:
        self.resets += 1
        log.info("consumer on %s reset after seq %d: %s", self.stream, self.last_seq, why)
        await self._drop()
        delay = 0.1
        while not self._closed:
            try:
                await self.start()
                return
            except ConsumerGone:
                raise
            except (StreamsError, ConnectionClosedError, OSError) as exc:
                log.warning(
                    "consumer on %s: cannot recreate (%s); retrying in %.1fs", self.stream, exc, delay
                )
                await self._drop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _drop(self) -> None:
        sub, self._sub = self._sub, None
        name, self._name = self._name, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if name is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await js_api(self.nc, f"$JS.API.CONSUMER.DELETE.{self.stream}.{name}")

    async def close(self) -> None:
        """Delete the consumer and stop the subscription; a waiting `next()` returns None."""
        self._closed = True
        if self._sub is not None:
            self._sub._pending_queue.put_nowait(_WAKE)
        await self._drop()

    async def next(self) -> Delivery | None:
        """The next message in stream order, or None once closed."""
        while not self._closed:
            sub = self._sub
            if sub is None:
                await self._reset("no consumer")
                continue
            queue: asyncio.Queue[Msg] = sub._pending_queue
            try:
                msg = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    msg = await asyncio.wait_for(queue.get(), 3 * self.idle_heartbeat)
                except TimeoutError:
                    if self._closed:
                        return None
                    await self._reset("no heartbeat")
                    continue
            if self._sub is not sub or msg is _WAKE:
                continue  # stale message of a consumer we replaced while waiting
            reply = msg.reply
            hdr = msg.headers
            if hdr is not None and "Status" in hdr:
                await self._control(msg, hdr)
                continue
            if not reply:
                continue
            seq, cseq, ts_ns, pending = _ack_fields(reply)
            if cseq != self._cseq + 1:
                await self._reset(f"gap: consumer seq {cseq} after {self._cseq}")
                continue
            self._cseq = cseq
            self.last_seq = seq
            return Delivery(seq, pending, ts_ns, msg.subject, msg.data, hdr)
        return None

    async def _control(self, msg: Msg, hdr: dict[str, str]) -> None:
        status = hdr.get("Status")
        if status == "100":
            if msg.reply:  # flow control request: everything before it has been handed out
                await self.nc.publish(msg.reply, b"")
                return
            stalled = hdr.get("Nats-Consumer-Stalled")
            if stalled:
                await self.nc.publish(stalled, b"")
            last = hdr.get("Nats-Last-Consumer")
            if last is not None and int(last) > self._cseq:
                await self._reset(f"heartbeat says consumer seq {last}, we have {self._cseq}")
            return
        if status == "409" or status == "404":
            await self._reset(f"status {status} {hdr.get('Description', '')}".strip())
