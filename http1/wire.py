"""HTTP/1.1 wire helpers shared by the client side and the upstream side of the proxy.

Heads are built by hand from bytes: the hot path never goes through a framework. Hop-by-hop
headers are dropped in both directions and the proxy writes its own framing headers.
"""

from __future__ import annotations

from http import HTTPStatus

# Headers that describe one connection, not the message: never forwarded as they are.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",
        b"host",
        b"content-length",
    }
)

_REASONS: dict[int, bytes] = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {
    code: b"HTTP/1.1 %d %s\r\n" % (code, reason) for code, reason in _REASONS.items()
}

CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"
JSON_CT = b"application/json"
SSE_CT = b"text/event-stream"


def status_line(status: int) -> bytes:
    """`HTTP/1.1 <code> <reason>\\r\\n`, cached for known codes."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d Unknown\r\n" % status
    return line


def build_head(
    status: int,
    headers: list[tuple[bytes, bytes]],
    *,
    content_length: int | None,
    keep_alive: bool,
) -> bytes:
    """A response head; `content_length=None` means chunked framing."""
    parts = [status_line(status)]
    for name, value in headers:
        parts.append(name + b": " + value + b"\r\n")
    if content_length is None:
        parts.append(b"transfer-encoding: chunked\r\n")
    else:
        parts.append(b"content-length: %d\r\n" % content_length)
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def simple_response(
    status: int,
    body: bytes,
    *,
    keep_alive: bool,
    content_type: bytes = JSON_CT,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> bytes:
    """A complete response with a body and Content-Length."""
    headers = [(b"content-type", content_type)]
    if extra:
        headers.extend(extra)
    return build_head(status, headers, content_length=len(body), keep_alive=keep_alive) + body


def chunk(data: bytes) -> bytes:
    """One chunk of chunked transfer encoding (never the terminating empty chunk)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def forwardable(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Response headers an upstream sent, minus hop-by-hop ones and those the proxy sets."""
    return [(n, v) for n, v in headers if n not in HOP_BY_HOP and n != b"x-request-id"]
