"""The raw NATS protocol parser: frames come out whole however the bytes are chunked."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.rawsub import Frame, _Protocol


class _Owner:
    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.control: list[bytes] = []

    def _control_line(self, line: bytes) -> None:
        self.control.append(line)

    def _wake(self) -> None:
        pass

    def _lost(self, exc: Any) -> None:
        pass


def _hmsg(subject: bytes, reply: bytes, hdr: bytes, payload: bytes) -> bytes:
    head = b"HMSG " + subject + b" 1 " + (reply + b" " if reply else b"")
    return (
        head
        + str(len(hdr)).encode()
        + b" "
        + str(len(hdr) + len(payload)).encode()
        + b"\r\n"
        + hdr
        + payload
        + b"\r\n"
    )


def _msg(subject: bytes, reply: bytes, payload: bytes) -> bytes:
    head = b"MSG " + subject + b" 1 " + (reply + b" " if reply else b"")
    return head + str(len(payload)).encode() + b"\r\n" + payload + b"\r\n"


STREAM = [
    (
        _hmsg(
            b"motor.evt.node.n1",
            b"$JS.ACK.MOTOR.c.1.1.1.1700.0",
            b"NATS/1.0\r\nA: b\r\n\r\n",
            b'{"x":"\r\n"}',
        ),
        True,
    ),
    (b"PING\r\n", False),
    (_msg(b"inbox.1", b"", b"hello"), True),
    (_hmsg(b"inbox.1", b"$JS.FC.x", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""), True),
    (b"+OK\r\n", False),
    (_msg(b"inbox.2", b"r.1", b""), True),
]
WIRE = b"".join(chunk for chunk, _ in STREAM)


def _expected() -> list[Frame]:
    return [
        (b"motor.evt.node.n1", b"$JS.ACK.MOTOR.c.1.1.1.1700.0", b"NATS/1.0\r\nA: b\r\n\r\n", b'{"x":"\r\n"}'),
        (b"inbox.1", b"", b"", b"hello"),
        (b"inbox.1", b"$JS.FC.x", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
        (b"inbox.2", b"r.1", b"", b""),
    ]


def test_whole_buffer() -> None:
    owner = _Owner()
    _Protocol(owner).data_received(WIRE)  # type: ignore[arg-type]
    assert owner.frames == _expected()
    assert owner.control == [b"PING", b"+OK"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(WIRE)), max_size=12))
def test_any_chunking(cuts: list[int]) -> None:
    owner = _Owner()
    proto = _Protocol(owner)  # type: ignore[arg-type]
    points = sorted(set([0, *cuts, len(WIRE)]))
    for a, b in itertools.pairwise(points):
        proto.data_received(WIRE[a:b])
    assert owner.frames == _expected()
    assert owner.control == [b"PING", b"+OK"]
    assert proto.buf == b""
