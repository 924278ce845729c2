"""`JetStreamLog`: the `streams.log.Log` of production, over one nats-py connection.

It adds no behaviour of its own: appends are `streams.publisher.Publisher`'s, ordered reading
`streams.consumer.PushConsumer`'s and `streams.reader`'s, stream settings
`streams.definitions.ensure_streams`'. What it does is say in the interface's terms what
nats-py says in its own: a nats-py error becomes a `StreamsError` (a KV write at the wrong
revision `WrongRevision`, a missing bucket `BucketMissing`), a key that is not found `None`, a
fetch that timed out an empty list.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import MsgAlreadyAckdError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from core.config import NatsConfig
from streams.cancelling import honour_swallowed_cancel
from streams.consumer import PushConsumer, js_api
from streams.definitions import ensure_streams
from streams.errors import StreamsError
from streams.log import (
    API_TIMEOUT,
    BucketMissing,
    Delivery,
    KVEntry,
    Message,
    Range,
    StreamMissing,
    WrongRevision,
)
from streams.lostlog import StreamView, parse_time_ns
from streams.publisher import WRONG_LAST_SEQUENCE, Publisher
from streams.reader import read_batches

JS_INFO = "$JS.API.INFO"  # the cheapest question JetStream answers
NO_MESSAGE = "no message found"  # STREAM.MSG.GET's answer for a sequence the stream does not hold


def _failed(what: str, exc: BaseException) -> StreamsError:
    return StreamsError(f"{what}: {exc or type(exc).__name__}")


class JetStreamLog:
    """The log on a NATS JetStream server (or cluster), through one client connection."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()

    @classmethod
    def of(cls, js: JetStreamContext) -> JetStreamLog:
        """The log of the connection a JetStream context was made from."""
        return cls(js._nc)

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    @property
    def reconnects(self) -> int:
        return int(self.nc.stats.get("reconnects", 0))

    async def answers(self, within: float) -> bool:
        # A request, not `nc.flush()`: nats-py leaves a flush that timed out in its PONG queue,
        # and the late PONG then kills the client's read loop for good.
        try:
            await self.nc.request(JS_INFO, b"", timeout=within)
        except (NatsError, TimeoutError, OSError):
            return False
        finally:
            honour_swallowed_cancel()  # the request's wait_for may have eaten the caller's cancel
        return True

    async def ensure_streams(
        self, cfg: NatsConfig | None = None, *, lease_ttl: float, update: bool = True
    ) -> None:
        await ensure_streams(self.js, cfg, lease_ttl=lease_ttl, update=update)

    async def stream_info(self, stream: str, *, wait: float = API_TIMEOUT) -> StreamView:
        return StreamView.from_info(await js_api(self.nc, f"$JS.API.STREAM.INFO.{stream}", wait=wait))

    async def last_subject_seq(self, stream: str, subject: str) -> int:
        try:
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return 0
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"last message of {subject}", exc) from exc
        return int(msg.seq or 0)

    async def message(self, stream: str, seq: int) -> Delivery | None:
        try:
            resp = await js_api(self.nc, f"$JS.API.STREAM.MSG.GET.{stream}", {"seq": seq})
        except StreamsError as exc:
            if isinstance(exc, StreamMissing) or NO_MESSAGE not in str(exc):
                raise
            return None
        m = resp.get("message") or {}
        ts = parse_time_ns(m.get("time"))
        return Delivery(
            int(m.get("seq", seq)), 0, ts, str(m.get("subject", "")), base64.b64decode(m.get("data") or b"")
        )

    def publisher(self, *, ack_timeout: float = 5.0) -> Publisher:
        return Publisher(self.js, ack_timeout=ack_timeout)

    def ordered(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        filter_subject: str | None = None,
        idle_heartbeat: float = 2.0,
        expect_created: str | None = None,
    ) -> PushConsumer:
        return PushConsumer(
            self.nc,
            stream,
            start_seq=start_seq,
            start_time=start_time,
            filter_subject=filter_subject,
            idle_heartbeat=idle_heartbeat,
            expect_created=expect_created,
        )

    async def durable(
        self,
        stream: str,
        name: str,
        *,
        filter_subject: str,
        ack_wait: float,
        max_ack_pending: int = 1,
        start_time: float | None = None,
    ) -> JetStreamDurable:
        cfg = ConsumerConfig(
            durable_name=name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
            max_deliver=-1,
            filter_subject=filter_subject,
        )
        if start_time is not None:
            cfg.deliver_policy = DeliverPolicy.BY_START_TIME
            cfg.opt_start_time = datetime.fromtimestamp(start_time, UTC)  # type: ignore[assignment]
        try:
            sub = await self.js.pull_subscribe(filter_subject, durable=name, stream=stream, config=cfg)
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"binding consumer {name}", exc) from exc
        return JetStreamDurable(self.js, sub, stream, name)

    def kv(self, bucket: str) -> JetStreamKV:
        return JetStreamKV(self.js, bucket)

    def read(self, stream: str, span: Range) -> AsyncIterator[list[Delivery]]:
        return read_batches(self.nc, stream, span)

    async def close(self) -> None:
        """Drain (bounded: a drain can hang on a dead server), then close."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.drain(), 5.0)
        with contextlib.suppress(Exception):
            await self.nc.close()


class JetStreamMessage:
    """One delivery of a durable consumer's message."""

    def __init__(self, msg: Msg) -> None:
        self.msg = msg
        self.subject = msg.subject
        self.data = msg.data
        meta = msg.metadata
        self.seq = int(meta.sequence.stream)
        self.delivered = int(meta.num_delivered)

    async def _do(self, how: str, within: float | None = None, delay: float | None = None) -> None:
        try:
            if how == "ack":
                await self.msg.ack_sync(timeout=within or 1.0)
            elif how == "nak":
                await self.msg.nak(delay=delay)
            elif how == "term":
                await self.msg.term()
            else:
                await self.msg.in_progress()
        except MsgAlreadyAckdError:
            return  # settled already: what was asked is done
        except (NatsError, OSError) as exc:
            raise _failed(f"{how} of seq {self.seq}", exc) from exc

    async def ack(self, within: float) -> None:
        await self._do("ack", within)

    async def nak(self, delay: float | None = None) -> None:
        await self._do("nak", delay=delay)

    async def term(self) -> None:
        await self._do("term")

    async def in_progress(self) -> None:
        await self._do("in_progress")


class JetStreamDurable:
    """A bound durable pull consumer."""

    def __init__(
        self, js: JetStreamContext, sub: JetStreamContext.PullSubscription, stream: str, name: str
    ) -> None:
        self.js, self.sub, self.stream, self.name = js, sub, stream, name

    async def fetch(self, wait: float) -> list[Message]:
        try:
            msgs = await self.sub.fetch(1, timeout=wait)
        except (NatsTimeoutError, TimeoutError):
            return []
        except NatsError as exc:
            raise _failed(f"fetching from {self.name}", exc) from exc
        return [JetStreamMessage(m) for m in msgs]

    async def exists(self) -> bool:
        try:
            await self.js.consumer_info(self.stream, self.name)
        except NotFoundError:
            return False
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"consumer info of {self.name}", exc) from exc
        return True

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()


class JetStreamKV:
    """One KV bucket (looked up on first use)."""

    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self.js, self.bucket = js, bucket
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except BucketNotFoundError:
                raise BucketMissing(f"KV bucket {self.bucket} missing (run ensure_streams)") from None
            except (NatsError, TimeoutError) as exc:
                raise _failed(f"KV bucket {self.bucket}", exc) from exc
        return self._kv

    async def create(self, key: str, value: bytes) -> int:
        kv = await self._bucket()
        try:
            return int(await kv.create(key, value))
        except KeyWrongLastSequenceError:
            raise WrongRevision(f"{self.bucket}/{key} holds a value") from None
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"create {self.bucket}/{key}", exc) from exc

    async def update(self, key: str, value: bytes, last: int) -> int:
        kv = await self._bucket()
        try:
            return int(await kv.update(key, value, last=last))
        except KeyWrongLastSequenceError:
            raise WrongRevision(f"{self.bucket}/{key} is not at revision {last}") from None
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"update {self.bucket}/{key}", exc) from exc

    async def put(self, key: str, value: bytes) -> int:
        kv = await self._bucket()
        try:
            return int(await kv.put(key, value))
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"put {self.bucket}/{key} ({len(value)} bytes)", exc) from exc

    async def get(self, key: str) -> KVEntry | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # never written, deleted, or aged out
            return None
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"get {self.bucket}/{key}", exc) from exc
        if entry.value is None:
            return None
        return KVEntry(entry.value, int(entry.revision or 0))

    async def delete(self, key: str, last: int | None = None) -> None:
        kv = await self._bucket()
        try:
            await kv.delete(key, last=last)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise WrongRevision(f"{self.bucket}/{key} is not at revision {last}") from None
            raise _failed(f"delete {self.bucket}/{key}", exc) from exc
        except (NatsError, TimeoutError) as exc:
            raise _failed(f"delete {self.bucket}/{key}", exc) from exc
