"""Publishing: dedupe by Nats-Msg-Id, expected-sequence conflicts, the async window."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from streams.definitions import MOTOR_STREAM
from streams.errors import PublishFailed, PublishTimeout, SequenceConflict
from streams.publisher import Publisher
from streams.reader import read_range
from tests import placed
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

    assert info.value.subject == placed.endpoint("n7")
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
        expected_subject=placed.endpoint("leader"),
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


async def test_publish_batch_sends_nothing_once_told_to_stop(js: JetStreamContext) -> None:
    outcomes = await Publisher(js).publish_batch(mixed(10), go_on=lambda: False)

    assert outcomes == []
    assert (await js.stream_info(MOTOR_STREAM)).state.messages == 0


async def test_a_batch_past_the_servers_limit_goes_in_chunks_each_whole(
    js: JetStreamContext, nc: Client
) -> None:
    events = mixed(1200)  # nats-server takes at most 1000 messages in one atomic batch
    asked = 0

    def go_on() -> bool:
        nonlocal asked
        asked += 1
        return True

    outcomes = await Publisher(js).publish_batch(events, go_on=go_on)

    assert asked == 2  # once a chunk: the lease is looked at before each
    assert outcomes == list(range(1, 1201))  # contiguous, in order
    assert [r.event.id async for r in read_range(nc)] == [e.id for e in events]


async def test_a_batch_holding_a_decision_already_stored_goes_one_by_one_deduplicated(
    js: JetStreamContext, nc: Client
) -> None:
    # An atomic batch refuses a message id it has stored (it does not deduplicate): the batch
    # is sent one at a time instead, where the stored one is acknowledged as a duplicate.
    events = mixed(6)
    pub = Publisher(js)
    first = await pub.publish(events[3])
    outcomes = await pub.publish_batch(events)

    assert all(isinstance(o, int) for o in outcomes), outcomes
    assert outcomes[3] == first
    assert sorted([r.event.id async for r in read_range(nc)]) == sorted(e.id for e in events)
    assert (await js.stream_info(MOTOR_STREAM)).state.messages == 6


async def test_a_stream_without_atomic_batches_takes_them_one_by_one(
    js: JetStreamContext, nc: Client
) -> None:
    info = await js.stream_info(MOTOR_STREAM)
    await js.update_stream(dataclasses.replace(info.config, allow_atomic=False))
    pub = Publisher(js)
    events = mixed(5)
    outcomes = await pub.publish_batch(events)

    assert outcomes == [1, 2, 3, 4, 5]
    assert pub._atomic is False  # found out once, not asked again
    assert [r.event.id async for r in read_range(nc)] == [e.id for e in events]


async def test_publish_batch_to_a_subject_without_stream_is_a_clear_error(js: JetStreamContext) -> None:
    await js.delete_stream(MOTOR_STREAM)
    outcomes = await Publisher(js, ack_timeout=5).publish_batch([status_changed(0)])
    assert len(outcomes) == 1 and isinstance(outcomes[0], PublishFailed) and "no stream" in str(outcomes[0])
