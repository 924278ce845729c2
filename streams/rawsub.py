"""A receive-only NATS protocol connection for bulk push-consumer delivery.

nats-py builds a `Msg`, parses every header block and queues each message for a task; on
a replay that is most of the cost (issue 2 measured 139k/s through nats-py against 329k/s
for a raw protocol reader). This connection parses `MSG`/`HMSG` frames straight into
tuples and hands them over in batches. It speaks just enough of the protocol for that:
CONNECT (user/password or token, TLS when the server asks or first), SUB, PING/PONG and the
one-line PUBs that answer flow control. Anything it cannot do (creds files, websockets)
makes `RawSubscriber.open` raise, and the caller falls back to nats-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any
from urllib.parse import urlparse

import orjson

from streams.errors import StreamsError

# A delivered frame: (subject, reply, header block or b"", payload).
Frame = tuple[bytes, bytes, bytes, bytes]

_CRLF = b"\r\n"
OPEN_TIMEOUT = 5.0


class RawUnsupported(StreamsError):
    """This connection cannot be made raw (e.g. creds-file auth); use nats-py instead."""


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: RawSubscriber) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._lost(exc)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        size = len(buf)
        frames = self.owner.frames
        owner = self.owner
        while pos < size:
            nl = buf.find(_CRLF, pos)
            if nl < 0:
                break
            op = buf[pos : pos + 4]
            if op == b"HMSG":
                parts = buf[pos + 5 : nl].split(b" ")
                if len(parts) == 5:
                    subject, _sid, reply, hlen_b, tlen_b = parts
                else:
                    subject, _sid, hlen_b, tlen_b = parts
                    reply = b""
                hlen = int(hlen_b)
                end = nl + 2 + int(tlen_b)
                if end + 2 > size:
                    break
                start = nl + 2
                frames.append((subject, reply, buf[start : start + hlen], buf[start + hlen : end]))
                pos = end + 2
            elif op == b"MSG ":
                parts = buf[pos + 4 : nl].split(b" ")
                if len(parts) == 4:
                    subject, _sid, reply, tlen_b = parts
                else:
                    subject, _sid, tlen_b = parts
                    reply = b""
                end = nl + 2 + int(tlen_b)
                if end + 2 > size:
                    break
                frames.append((subject, reply, b"", buf[nl + 2 : end]))
                pos = end + 2
            else:
                owner._control_line(buf[pos:nl])
                pos = nl + 2
        self.buf = buf[pos:]
        if frames:
            owner._wake()


class RawSubscriber:
    """One connection, one subscription: `await batch()` returns the frames received so far."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        tls_first: bool = False,
    ) -> None:
        self.url = url
        self.name = name
        self.user = user
        self.password = password
        self.token = token
        self.tls = tls
        self.tls_first = tls_first  # TLS before INFO (the server's `handshake_first`)
        self.frames: list[Frame] = []
        self.closed = False
        self.error: BaseException | None = None
        self._proto: _Protocol | None = None
        self._ready = asyncio.Event()
        self._pong: asyncio.Future[None] | None = None
        self._info: asyncio.Future[dict[str, Any]] | None = None

    async def open(self, subject: str) -> None:
        """Connect, authenticate and subscribe to `subject` (sid 1)."""
        timeout = OPEN_TIMEOUT
        u = urlparse(self.url if "://" in self.url else f"nats://{self.url}")
        if u.scheme not in ("nats", "tls"):
            raise RawUnsupported(f"raw reader cannot use {u.scheme!r} URLs")
        host, port = u.hostname or "127.0.0.1", u.port or 4222
        user = self.user or (u.username or None)
        password = self.password or (u.password or None)
        loop = asyncio.get_running_loop()
        self._info = loop.create_future()
        first = (self.tls or ssl.create_default_context()) if self.tls_first else None
        transport, proto = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Protocol(self), host, port, ssl=first, server_hostname=host if first else None
            ),
            timeout,
        )
        self._proto = proto
        info = await asyncio.wait_for(self._info, timeout)
        tls = self.tls
        if first is None and (info.get("tls_required") or u.scheme == "tls"):
            tls = tls or ssl.create_default_context()
            new = await loop.start_tls(transport, proto, tls, server_hostname=host)
            if new is None:
                raise StreamsError("TLS upgrade failed")
            proto.transport = new  # type: ignore[assignment]
        if info.get("nonce") and not (user or self.token):
            raise RawUnsupported("server wants nkey/JWT auth; raw reader does not sign nonces")
        connect: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "no_responders": True,
            "protocol": 1,
            "lang": "python-motor-raw",
            "version": "1",
            "name": self.name,
            "echo": False,
        }
        if user:
            connect["user"] = user
            connect["pass"] = password or ""
        if self.token:
            connect["auth_token"] = self.token
        self._pong = loop.create_future()
        self._write(b"CONNECT " + orjson.dumps(connect) + b"\r\nPING\r\n")
        await asyncio.wait_for(self._pong, timeout)  # the server answers -ERR first on bad auth
        self._write(f"SUB {subject} 1\r\n".encode())

    def _write(self, data: bytes) -> None:
        proto = self._proto
        if proto is None or proto.transport is None or self.closed:
            raise StreamsError("raw connection is closed")
        proto.transport.write(data)

    def publish_empty(self, subject: bytes) -> None:
        """Send an empty message (answers flow control)."""
        self._write(b"PUB " + subject + b" 0\r\n\r\n")

    def _control_line(self, line: bytes) -> None:
        if line == b"PING":
            self._write(b"PONG\r\n")
        elif line == b"PONG":
            if self._pong is not None and not self._pong.done():
                self._pong.set_result(None)
        elif line.startswith(b"INFO "):
            if self._info is not None and not self._info.done():
                self._info.set_result(orjson.loads(line[5:]))
        elif line.startswith(b"-ERR"):
            err = StreamsError(f"NATS {line.decode(errors='replace')}")
            for fut in (self._pong, self._info):
                if fut is not None and not fut.done():
                    fut.set_exception(err)
            self.error = err

    def _wake(self) -> None:
        self._ready.set()

    def _lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = self.error or exc or StreamsError("raw connection closed")
        for fut in (self._pong, self._info):
            if fut is not None and not fut.done():
                fut.set_exception(self.error)
        self._ready.set()

    async def batch(self, timeout: float) -> list[Frame] | None:  # noqa: ASYNC109
        """Frames received so far (waiting up to `timeout` for one); None on timeout."""
        if not self.frames:
            if self.closed:
                raise StreamsError(f"raw connection lost: {self.error}")
            self._ready.clear()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                # that races with the event, and a reader being closed would never stop.
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
            except TimeoutError:
                return None
            if not self.frames:
                if self.closed:
                    raise StreamsError(f"raw connection lost: {self.error}")
                return None
        frames, self.frames = self.frames, []
        return frames

    def wake(self) -> None:
        """Make a waiting `batch()` return (used by close)."""
        self._ready.set()

    async def close(self) -> None:
        """Close the connection."""
        self.closed = True
        self._ready.set()
        proto = self._proto
        if proto is not None and proto.transport is not None:
            with contextlib.suppress(Exception):
                proto.transport.close()
