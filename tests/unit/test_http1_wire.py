"""HTTP/1.1 wire helpers of the proxy: heads, framing, hop-by-hop filtering."""

from __future__ import annotations

import httptools
import pytest

from http1 import wire


def parse(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    got: dict[str, object] = {"headers": {}, "body": b""}

    class P:
        def on_header(self, n: bytes, v: bytes) -> None:
            got["headers"][n.lower()] = v  # type: ignore[index]

        def on_body(self, b: bytes) -> None:
            got["body"] += b  # type: ignore[operator]

    p = httptools.HttpResponseParser(P())
    p.feed_data(raw)
    return p.get_status_code(), got["headers"], got["body"]  # type: ignore[return-value]


@pytest.mark.parametrize("keep_alive", [True, False])
def test_simple_response_round_trips(keep_alive: bool) -> None:
    raw = wire.simple_response(404, b'{"x":1}', keep_alive=keep_alive, extra=[(b"x-request-id", b"r1")])
    status, headers, body = parse(raw)
    assert (status, body) == (404, b'{"x":1}')
    assert headers[b"content-length"] == b"7"
    assert headers[b"x-request-id"] == b"r1"
    assert (headers.get(b"connection") == b"close") is not keep_alive


def test_chunked_head_and_chunks_round_trip() -> None:
    head = wire.build_head(200, [(b"content-type", wire.SSE_CT)], content_length=None, keep_alive=True)
    raw = head + wire.chunk(b"data: a\n\n") + wire.chunk(b"data: [DONE]\n\n") + wire.LAST_CHUNK
    status, headers, body = parse(raw)
    assert status == 200
    assert headers[b"transfer-encoding"] == b"chunked"
    assert body == b"data: a\n\ndata: [DONE]\n\n"


def test_forwardable_drops_hop_by_hop_and_framing() -> None:
    given = [
        (b"content-type", b"application/json"),
        (b"connection", b"keep-alive"),
        (b"transfer-encoding", b"chunked"),
        (b"content-length", b"5"),
        (b"x-request-id", b"engine-id"),
        (b"server", b"uvicorn"),
    ]
    assert wire.forwardable(given) == [(b"content-type", b"application/json"), (b"server", b"uvicorn")]


def test_unknown_status_still_has_a_line() -> None:
    assert wire.status_line(599) == b"HTTP/1.1 599 Unknown\r\n"
    assert wire.status_line(429) == b"HTTP/1.1 429 Too Many Requests\r\n"
