"""A raw HTTP/1.1 client for the tests that send what no well-behaved client sends: bytes in,
one parsed response (or the connection's end) out.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httptools
import orjson


@dataclass
class Reply:
    """One response read off a raw connection; `status` 0 when the server closed without one."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False
    elapsed: float = 0.0
    head_only: bool = False  # the answer to a HEAD request: no body to check

    def json(self) -> object:
        return orjson.loads(self.body)


class _Collect:
    """Parses responses off one connection, pipelined ones included."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.replies.append(Reply())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.replies[-1].headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.replies[-1].status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.replies[-1].body += body

    def on_message_complete(self) -> None:
        self.replies[-1].complete = True


async def read_replies(reader: asyncio.StreamReader, n: int, within: float = 30.0) -> list[Reply]:
    """Read `n` responses (fewer if the connection ends first; a last one may be partial)."""
    c = _Collect()
    t0 = time.monotonic()
    deadline = t0 + within
    while sum(1 for r in c.replies if r.complete) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {n} complete responses within {within}s (got {c.replies!r})")
        try:
            data = await asyncio.wait_for(reader.read(65536), left)
        except (ConnectionResetError, BrokenPipeError):
            break
        if not data:
            break
        c.parser.feed_data(data)
    for r in c.replies:
        r.elapsed = time.monotonic() - t0
    return c.replies[:n]


async def read_reply(reader: asyncio.StreamReader, within: float = 30.0) -> Reply:
    """Read one response; stops at its end, at EOF or at a reset (status 0: none came)."""
    replies = await read_replies(reader, 1, within)
    return replies[0] if replies else Reply(elapsed=within)


async def exchange(port: int, raw: bytes, within: float = 30.0, host: str = "127.0.0.1") -> Reply:
    """Open a connection, send `raw` whole, read one response, close."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        try:
            writer.write(raw)
            await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass
        return await read_reply(reader, within)
    finally:
        writer.close()


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    close: bool = True,
) -> bytes:
    """A well-formed request's bytes."""
    lines = [f"{method} {path} HTTP/1.1", "host: test"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body or method in ("POST", "PUT"):
        lines.append(f"content-length: {len(body)}")
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def closed_within(reader: asyncio.StreamReader, within: float) -> tuple[bool, bytes]:
    """(closed, bytes read): whether the server ends the connection within `within` s."""
    got = b""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, got
        try:
            data = await asyncio.wait_for(reader.read(65536), left)
        except TimeoutError:
            return False, got
        except (ConnectionResetError, BrokenPipeError):
            return True, got
        if not data:
            return True, got
        got += data
