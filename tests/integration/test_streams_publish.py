"""Publishing: dedupe by Nats-Msg-Id, expected-sequence conflicts, the async window."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core import subjects
from streams.definitions import MOTOR_STREAM
from streams.errors import PublishFailed, SequenceConflict
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
