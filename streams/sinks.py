"""Where a push consumer's messages arrive: a receive-only protocol connection or nats-py.

`streams.rawsub` (a dedicated receive-only connection) is several times cheaper per message
than nats-py's subscription machinery; it is used whenever the client's credentials can be
replayed on a connection of its own. Otherwise a nats-py subscription with its pending limits
lifted takes the messages (flow control bounds the backlog instead). Either hands out raw
`Frame`s in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from streams.connection import options_for
from streams.errors import StreamsError
from streams.rawsub import Frame, RawSubscriber, RawUnsupported

log = logging.getLogger(__name__)


class Sink(Protocol):
    """An inbox subscription a push consumer delivers to."""

    inbox: str
    transport: str  # "raw" | "nats-py", for logs and tests

    async def open(self) -> None: ...

    async def batch(self, timeout: float) -> list[Frame] | None:  # noqa: ASYNC109
        """The frames that arrived (at least one), None after `timeout` without any, [] once closed."""
        ...

    async def publish_empty(self, subject: bytes) -> None: ...

    def wake(self) -> None:
        """Make a waiting `batch` return."""
        ...

    async def close(self) -> None: ...


async def open_sink(nc: Client, raw: bool | None) -> Sink:
    """An open sink: raw when possible (`raw=None`), always (`True`), or never (`False`)."""
    if raw is not False:
        raw_sink: RawSink | None = None
        try:
            raw_sink = RawSink(nc, raw_subscriber(nc))
            await raw_sink.open()
            return raw_sink
        except (RawUnsupported, StreamsError, OSError, TimeoutError) as exc:
            if raw_sink is not None:
                await raw_sink.close()
            if raw:
                raise
            log.info("raw reader unavailable (%s); using nats-py", exc)
    sink = PySink(nc)
    await sink.open()
    return sink


class PySink:
    """Delivery through a nats-py subscription (the fallback)."""

    transport = "nats-py"

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._closed = False

    async def open(self) -> None:
        # 0 lifts both limits: flow control bounds the backlog instead.
        self._sub = await self.nc.subscribe(self.inbox, pending_msgs_limit=0, pending_bytes_limit=0)

    async def batch(self, timeout: float) -> list[Frame] | None:  # noqa: ASYNC109
        sub = self._sub
        if sub is None or self._closed:
            return []
        queue: asyncio.Queue[Msg | None] = sub._pending_queue  # type: ignore[assignment]
        if queue.empty():
            try:
                async with asyncio.timeout(timeout):  # not wait_for: see rawsub.batch
                    first = await queue.get()
            except TimeoutError:
                return None
            msgs = [first]
        else:
            msgs = []
        while not queue.empty():
            msgs.append(queue.get_nowait())
        return [_frame(m) for m in msgs if m is not None]

    async def publish_empty(self, subject: bytes) -> None:
        await self.nc.publish(subject.decode(), b"")

    def wake(self) -> None:
        if self._sub is not None:
            self._sub._pending_queue.put_nowait(None)  # type: ignore[arg-type]

    async def close(self) -> None:
        self._closed = True
        self.wake()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


def _frame(m: Msg) -> Frame:
    hdr = m.headers
    if not hdr:
        raw = b""
    elif "Status" in hdr:
        rest = "".join(f"{k}: {v}\r\n" for k, v in hdr.items() if k not in ("Status", "Description"))
        raw = f"NATS/1.0 {hdr['Status']} {hdr.get('Description', '')}\r\n{rest}\r\n".encode()
    else:
        raw = ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdr.items()) + "\r\n").encode()
    return (m.subject.encode(), (m.reply or "").encode(), raw, m.data)


class RawSink:
    """Delivery through a dedicated receive-only connection (the fast path)."""

    transport = "raw"

    def __init__(self, nc: Client, raw: RawSubscriber) -> None:
        self.inbox = nc.new_inbox()
        self.raw = raw

    async def open(self) -> None:
        await self.raw.open(self.inbox)

    async def batch(self, timeout: float) -> list[Frame] | None:  # noqa: ASYNC109
        return await self.raw.batch(timeout)

    async def publish_empty(self, subject: bytes) -> None:
        self.raw.publish_empty(subject)

    def wake(self) -> None:
        self.raw.wake()

    async def close(self) -> None:
        await self.raw.close()


def raw_subscriber(nc: Client) -> RawSubscriber:
    """A receive-only connection with the client's server and credentials; RawUnsupported when it cannot be made so."""
    url = nc.connected_url
    if url is None:
        raise RawUnsupported("client is not connected")
    opts = options_for(nc)
    if opts is not None and opts.creds_file:
        raise RawUnsupported("creds-file auth")
    user = opts.user if opts else nc.options.get("user")
    password = opts.password if opts else nc.options.get("password")
    token = opts.token if opts else nc.options.get("token")
    tls = opts.tls_context() if opts else nc.options.get("tls")
    if opts is None and getattr(nc, "_user_credentials", None) is not None:
        raise RawUnsupported("creds-file auth")
    if callable(user) or callable(password) or callable(token):
        raise RawUnsupported("callback credentials")
    name = f"{nc.options.get('name') or 'motor'}-reader"
    return RawSubscriber(
        url.geturl(),
        name=name,
        user=user,
        password=password,
        token=token,
        tls=tls,
        tls_first=bool(opts.tls_first if opts else nc.options.get("tls_handshake_first")),
    )
