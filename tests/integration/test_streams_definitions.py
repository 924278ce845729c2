"""ensure_streams: creates everything, is idempotent, updates a changed config."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from core import subjects
from core.config import NatsConfig
from streams.definitions import (
    CHECKPOINT_BUCKET,
    DAY,
    HB_STREAM,
    LEADER_BUCKET,
    MOTOR_MAX_CONSUMERS,
    MOTOR_STREAM,
    ensure_streams,
    kv_stream,
    stream_configs,
)
from streams.errors import StreamsError
from streams.permissions import durable_name


async def test_ensure_streams_creates_streams_and_buckets(js: JetStreamContext) -> None:
    motor = await js.stream_info(MOTOR_STREAM)
    hb = await js.stream_info(HB_STREAM)

    assert sorted(motor.config.subjects or []) == ["motor.cmd.>", "motor.evt.>"]
    assert motor.config.duplicate_window == 120
    assert motor.config.max_age == 30 * DAY
    assert hb.config.subjects == ["motor.hb.>"]
    assert hb.config.max_msgs_per_subject == 1
    leader = await js.key_value(LEADER_BUCKET)
    await leader.put("lease", b"c1")
    assert (await leader.get("lease")).value == b"c1"
    await (await js.key_value(CHECKPOINT_BUCKET)).put("k", b"v")


async def test_ensure_streams_twice_changes_nothing(js: JetStreamContext) -> None:
    before = {n: (await js.stream_info(n)).created for n in (MOTOR_STREAM, HB_STREAM)}
    cfg_before = (await js.stream_info(MOTOR_STREAM)).config

    await ensure_streams(js)

    after = {n: (await js.stream_info(n)).created for n in (MOTOR_STREAM, HB_STREAM)}
    assert after == before
    assert (await js.stream_info(MOTOR_STREAM)).config == cfg_before


async def test_ensure_streams_updates_a_changed_config(js: JetStreamContext) -> None:
    await js.publish("motor.evt.node.n1", b"{}")

    await ensure_streams(js, NatsConfig(max_age_days=2), lease_ttl=10.0)

    motor = await js.stream_info(MOTOR_STREAM)
    assert motor.config.max_age == 2 * DAY
    assert motor.state.messages == 1  # updated in place, nothing lost
    assert (await js.stream_info(kv_stream(LEADER_BUCKET))).config.max_age == 10.0


async def test_ensure_streams_reports_a_change_it_cannot_make(js: JetStreamContext) -> None:
    # Replicas cannot go to 3 on a single server: a clear error, not a crash.
    with pytest.raises(StreamsError, match=MOTOR_STREAM):
        await ensure_streams(js, NatsConfig(replicas=3))


async def test_more_than_a_thousand_node_agents_bind_their_command_consumers(js: JetStreamContext) -> None:
    # nats-server 2.15 caps a stream that sets no max_consumers at 1000 consumers: the agent of
    # about the 1000th node could not bind its command consumer. A MOTOR made by an older
    # Motor (no limit set) gets the limit on the next ensure_streams.
    await js.delete_stream(MOTOR_STREAM)
    old = dataclasses.replace(stream_configs()[0], max_consumers=None)
    await js.add_stream(old)
    await ensure_streams(js)
    assert (await js.stream_info(MOTOR_STREAM)).config.max_consumers == MOTOR_MAX_CONSUMERS
    try:
        for i in range(1010):
            node = f"n{i}"
            cfg = ConsumerConfig(
                durable_name=durable_name(node),
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.NEW,
                max_ack_pending=1,
                filter_subject=subjects.node_commands(node),
            )
            await js.add_consumer(MOTOR_STREAM, cfg)
        assert (await js.stream_info(MOTOR_STREAM)).state.consumer_count == 1010
    finally:
        await js.delete_stream(MOTOR_STREAM)  # a thousand consumers need not outlive the test
        await ensure_streams(js)
