"""Publishing: dedupe by Nats-Msg-Id, expected-sequence conflicts, the async window."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from core import subjects
from streams.definitions import MOTOR_STREAM
from streams.errors import PublishFailed, PublishTimeout, SequenceConflict
from streams.publisher import Publisher
from streams.reader import read_range
from tests.integration.streams_events import mixed, status_changed


async def test_same_event_id_twice_is_stored_once(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js)
    ev = status_changed(1)
    first = await pub.publish(ev)
    again = await pub.publish(ev)

    assert again == first
    assert (await js.stream_info(MOTOR_STREAM)).state.messages == 1


async def test_expected_last_subject_seq_conflict_is_a_typed_error(js: JetStreamContext) -> None:
    pub = Publisher(js)
    seq1 = await pub.publish(status_changed(0, node="n7"), expected_last_subject_seq=0)
    seq2 = await pub.publish(status_changed(1, node="n7"), expected_last_subject_seq=seq1)

    with pytest.raises(SequenceConflict) as info:
        # A second writer that still believes seq1 is the latest loses.
        await pub.publish(status_changed(2, node="n7"), expected_last_subject_seq=seq1)

    assert info.value.subject == subjects.endpoint("n7")
    assert info.value.expected == seq1
    # Other subjects are independent.
    await pub.publish(status_changed(3, node="n8"), expected_last_subject_seq=0)
    assert seq2 > seq1


async def test_publish_async_window_keeps_order_and_flush_waits(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js, window=8)
    events = mixed(300)
    for ev in events:
        await pub.publish_async(ev)
        assert pub.outstanding <= 8
    await pub.flush()

    assert pub.outstanding == 0
    assert [r.event for r in [r async for r in read_range(nc)]] == events


async def test_publish_to_subject_without_stream_is_a_clear_error(js: JetStreamContext) -> None:
    await js.delete_stream(MOTOR_STREAM)
    with pytest.raises(PublishFailed, match="no stream"):
        await Publisher(js, ack_timeout=5).publish(status_changed(0))


async def test_publish_batch_keeps_order_and_gives_each_sequence(js: JetStreamContext, nc: Client) -> None:
    events = mixed(300)
    outcomes = await Publisher(js, window=8).publish_batch(events)

    assert all(isinstance(o, int) for o in outcomes)
    assert outcomes == sorted(outcomes) and len(set(outcomes)) == 300
    assert [r.event for r in [r async for r in read_range(nc)]] == events


async def test_publish_batch_reports_a_moved_fence_as_a_conflict_not_a_timeout(js: JetStreamContext) -> None:
    # nats-py's publish_async loses the refusal (its reply handler raises the APIError) and the
    # future times out: a deposed controller would have read its fence as NATS being slow.
    pub = Publisher(js, ack_timeout=5)
    fence = await pub.publish(status_changed(0, node="leader"))
    await pub.publish(status_changed(1, node="leader"))  # someone else announced
    started = time.monotonic()
    outcomes = await pub.publish_batch(
        [status_changed(i, node="n7") for i in range(2, 6)],
        expected_last_subject_seq=fence,
        expected_subject=subjects.endpoint("leader"),
    )

    assert all(isinstance(o, SequenceConflict) for o in outcomes), outcomes
    assert time.monotonic() - started < 4  # answered, not timed out
    assert (await js.stream_info(MOTOR_STREAM)).state.messages == 2


async def test_publish_batch_sends_the_batch_before_any_ack(js: JetStreamContext, nc: Client) -> None:
    # No stream and a listener that never acks: one publish at a time would send the second
    # only after the first timed out.
    await js.delete_stream(MOTOR_STREAM)
    got: list[str] = []

    async def listen(msg: Msg) -> None:
        got.append(msg.subject)

    sub = await nc.subscribe("motor.evt.>", cb=listen)
    try:
        batch = Publisher(js, window=16, ack_timeout=3).publish_batch(mixed(10))
        task = asyncio.create_task(batch)
        deadline = time.monotonic() + 2
        while len(got) < 10:
            assert time.monotonic() < deadline, f"only {len(got)} of 10 sent before any ack"
            await asyncio.sleep(0.02)  # the listener runs on the client's read loop
        outcomes = await task
        assert all(isinstance(o, PublishTimeout) for o in outcomes)
    finally:
        await sub.unsubscribe()


async def test_publish_batch_sends_nothing_more_once_told_to_stop(js: JetStreamContext) -> None:
    budget = iter([True, True, True])
    outcomes = await Publisher(js).publish_batch(mixed(10), go_on=lambda: next(budget, False))

    assert len(outcomes) == 3 and all(isinstance(o, int) for o in outcomes)
    assert (await js.stream_info(MOTOR_STREAM)).state.messages == 3


async def test_publish_batch_to_a_subject_without_stream_is_a_clear_error(js: JetStreamContext) -> None:
    await js.delete_stream(MOTOR_STREAM)
    outcomes = await Publisher(js, ack_timeout=5).publish_batch([status_changed(0)])
    assert len(outcomes) == 1 and isinstance(outcomes[0], PublishFailed) and "no stream" in str(outcomes[0])
