"""Replay-then-follow: no gap, no duplicate, through publishes, consumer loss and restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from streams.connection import connect
from streams.consumer import js_api
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.publisher import Publisher
from streams.reader import Record
from streams.server import EmbeddedNats
from tests.follower import Follower
from tests.integration.streams_events import mixed

DEADLINE = 60.0


async def _collect(follower: Follower, n: int, out: list[Record]) -> None:
    async for rec in follower:
        out.append(rec)
        if len(out) == n:
            return


def _assert_contiguous(records: list[Record], first_seq: int, n: int) -> None:
    seqs = [r.seq for r in records]
    assert seqs == list(range(first_seq, first_seq + n)), "gap or duplicate"


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "nats-py"])
async def test_follow_while_publishing_concurrently(js: JetStreamContext, nc: Client, raw: bool) -> None:
    events = mixed(600)
    pub = Publisher(js, window=64)
    for ev in events[:200]:
        await pub.publish_async(ev)
    await pub.flush()

    async def publish_rest() -> None:
        for ev in events[200:]:
            await pub.publish_async(ev)
        await pub.flush()

    follower = Follower(nc, raw=raw)
    got: list[Record] = []
    producer = asyncio.create_task(publish_rest())
    try:
        await asyncio.wait_for(_collect(follower, len(events), got), DEADLINE)
        await producer
    finally:
        producer.cancel()
        await follower.close()

    assert follower.transport == ("raw" if raw else "nats-py")
    # Not `caught_up`: it is set once the caller has taken a record with nothing pending, and a
    # follower that trailed the producer to the end met that only at the 600th, which
    # `_collect` takes and leaves (the flag's own tests are below).
    _assert_contiguous(got, 1, len(events))
    assert [r.event for r in got] == events


async def test_follow_from_a_sequence_starts_there(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js)
    events = mixed(30)
    for ev in events:
        await pub.publish(ev)
    follower = Follower(nc, start_seq=11)
    got: list[Record] = []
    try:
        await asyncio.wait_for(_collect(follower, 20, got), DEADLINE)
    finally:
        await follower.close()
    assert [r.event for r in got] == events[10:]


async def test_empty_stream_is_caught_up_at_once(js: JetStreamContext, nc: Client) -> None:
    follower = Follower(nc)
    try:
        await asyncio.wait_for(follower.start(), DEADLINE)
        assert follower.caught_up.is_set()
    finally:
        await follower.close()


async def test_deleted_consumer_is_recreated_without_gap(js: JetStreamContext, nc: Client) -> None:
    events = mixed(60)
    pub = Publisher(js)
    for ev in events[:30]:
        await pub.publish(ev)
    follower = Follower(nc, idle_heartbeat=0.5)
    got: list[Record] = []
    task = asyncio.create_task(_collect(follower, 60, got))
    try:
        await asyncio.wait_for(follower.caught_up.wait(), DEADLINE)
        # Someone (an operator, a server restart) removes the consumer under us.
        names = await js_api(nc, f"$JS.API.CONSUMER.NAMES.{MOTOR_STREAM}")
        for name in names["consumers"]:
            await js_api(nc, f"$JS.API.CONSUMER.DELETE.{MOTOR_STREAM}.{name}")
        for ev in events[30:]:
            await pub.publish(ev)
        await asyncio.wait_for(task, DEADLINE)
    finally:
        task.cancel()
        await follower.close()
    assert follower.resets >= 1
    _assert_contiguous(got, 1, 60)
    assert [r.event for r in got] == events


async def test_follower_survives_a_server_restart(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    nc = None
    follower = None
    task = None
    try:
        nc = await connect(server.url, name="restart-test")
        js = nc.jetstream()
        await ensure_streams(js)
        events = mixed(40)
        pub = Publisher(js)
        for ev in events[:20]:
            await pub.publish(ev)
        follower = Follower(nc, idle_heartbeat=0.5)
        got: list[Record] = []
        task = asyncio.create_task(_collect(follower, 40, got))
        await asyncio.wait_for(follower.caught_up.wait(), DEADLINE)

        await server.stop()
        await server.start()  # same port, same data: sync_interval always kept every ack
        # Publish as soon as the client is back; the follower must pick up after seq 20.
        deadline = asyncio.get_running_loop().time() + DEADLINE
        while not nc.is_connected:
            assert asyncio.get_running_loop().time() < deadline, "client did not reconnect"
            await asyncio.sleep(0.05)
        for ev in events[20:]:
            await pub.publish(ev)
        await asyncio.wait_for(task, DEADLINE)
        assert follower.resets >= 1  # the in-memory consumer died with the server
        _assert_contiguous(got, 1, 40)
        assert [r.event for r in got] == events
    finally:
        if task is not None:
            task.cancel()
        if follower is not None:
            await follower.close()
        if nc is not None:
            await nc.close()
        await server.stop()
