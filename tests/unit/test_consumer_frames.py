"""PushConsumer's frame handling: order, gaps by consumer sequence, flow control, heartbeats.

The frames are what nats-server sends a push consumer; the sink records what the consumer
answers. Recreating the consumer (I/O) is recorded instead of done; the integration tests
cover the real thing.
"""

from __future__ import annotations

from typing import Any

from streams.consumer import Delivery, PushConsumer, parse_status


class _Sink:
    def __init__(self) -> None:
        self.published: list[bytes] = []

    async def publish_empty(self, subject: bytes) -> None:
        self.published.append(subject)


class _Consumer(PushConsumer):
    def __init__(self) -> None:
        super().__init__(None, "MOTOR")  # type: ignore[arg-type]
        self.reset_reasons: list[str] = []
        self._name = "c1"  # the consumer the frames below belong to

    async def _reset(self, why: str) -> None:
        self.reset_reasons.append(why)
        self._cseq = 0  # a new consumer numbers from 1 again


def data(sseq: int, cseq: int, pending: int, subject: bytes = b"motor.evt.node.n1") -> tuple[bytes, ...]:
    reply = f"$JS.ACK.MOTOR.c1.1.{sseq}.{cseq}.{1_700_000_000_000_000_000 + sseq}.{pending}".encode()
    return (subject, reply, b"NATS/1.0\r\nNats-Msg-Id: x\r\nMotor-Type: node.registered\r\n\r\n", b"{}")


def data_v2(sseq: int, cseq: int, pending: int) -> tuple[bytes, ...]:
    reply = f"$JS.ACK.hub.ACCHASH.MOTOR.c1.1.{sseq}.{cseq}.1700000000000000000.{pending}.tok".encode()
    return (b"motor.evt.node.n1", reply, b"", b"{}")


FC = (b"inbox", b"$JS.FC.MOTOR.c1.abc", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b"")


def heartbeat(last_consumer: int, stalled: str | None = None) -> tuple[bytes, ...]:
    hdr = f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {last_consumer}\r\nNats-Last-Stream: 9\r\n"
    if stalled:
        hdr += f"Nats-Consumer-Stalled: {stalled}\r\n"
    return (b"inbox", b"", (hdr + "\r\n").encode(), b"")


async def handle(c: _Consumer, sink: _Sink, frames: list[Any]) -> list[Delivery]:
    return await c._handle(sink, frames)  # type: ignore[arg-type]


async def test_in_order_frames_become_deliveries() -> None:
    c, sink = _Consumer(), _Sink()
    out = await handle(c, sink, [data(5, 1, 2), data(9, 2, 1), data_v2(10, 3, 0)])
    assert [(d.seq, d.pending) for d in out] == [(5, 2), (9, 1), (10, 0)]  # stream seqs may have holes
    assert out[0].ts_ns == 1_700_000_000_000_000_005
    assert out[0].subject == "motor.evt.node.n1"
    assert c.last_seq == 10 and c.reset_reasons == []


async def test_messages_of_another_consumer_in_our_inbox_are_dropped() -> None:
    c, sink = _Consumer(), _Sink()
    evil = (b"motor.evt.node.n1", b"$JS.ACK.MOTOR.evil.1.1.1.1700000000000000001.0", b"", b"{}")
    out = await handle(c, sink, [evil, data(5, 1, 1), evil, data(6, 2, 0)])
    assert [d.seq for d in out] == [5, 6]
    assert c.foreign == 2 and c.reset_reasons == []


async def test_a_consumer_sequence_gap_resets_after_the_good_part() -> None:
    c, sink = _Consumer(), _Sink()
    out = await handle(c, sink, [data(1, 1, 5), data(2, 2, 4), data(4, 4, 2), data(5, 5, 1)])
    assert [d.seq for d in out] == [1, 2]
    assert c.last_seq == 2  # the new consumer starts after the last message handed out
    assert len(c.reset_reasons) == 1 and "gap" in c.reset_reasons[0]


async def test_flow_control_is_answered_in_order() -> None:
    c, sink = _Consumer(), _Sink()
    out = await handle(c, sink, [data(1, 1, 1), FC, data(2, 2, 0)])
    assert [d.seq for d in out] == [1, 2]
    assert sink.published == [b"$JS.FC.MOTOR.c1.abc"]


async def test_heartbeat_reporting_more_than_we_saw_resets() -> None:
    c, sink = _Consumer(), _Sink()
    await handle(c, sink, [data(1, 1, 0)])
    out = await handle(c, sink, [heartbeat(3)])
    assert out == []
    assert len(c.reset_reasons) == 1 and "heartbeat" in c.reset_reasons[0]


async def test_quiet_heartbeat_is_fine_and_a_stall_is_answered() -> None:
    c, sink = _Consumer(), _Sink()
    await handle(c, sink, [data(1, 1, 0)])
    await handle(c, sink, [heartbeat(1, stalled="$JS.FC.MOTOR.c1.zzz")])
    assert c.reset_reasons == []
    assert sink.published == [b"$JS.FC.MOTOR.c1.zzz"]


async def test_consumer_deleted_status_resets() -> None:
    c, sink = _Consumer(), _Sink()
    await handle(c, sink, [(b"inbox", b"", b"NATS/1.0 409 Consumer Deleted\r\n\r\n", b"")])
    assert c.reset_reasons == ["status 409 Consumer Deleted"]


def test_parse_status() -> None:
    code, hdrs = parse_status(b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 7\r\n\r\n")
    assert code == "100"
    assert hdrs == {"Description": "Idle Heartbeat", "Nats-Last-Consumer": "7"}
