"""Publish, read back and follow against a real nats-server."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.js import JetStreamContext

from core import subjects
from streams.publisher import Publisher
from streams.reader import read_range
from tests.follower import Follower
from tests.integration.streams_events import mixed, status_changed


async def test_publish_then_read_range_returns_events_in_order(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js)
    events = mixed(50)
    seqs = [await pub.publish(ev) for ev in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == 50

    got = [r async for r in read_range(nc)]

    assert [r.event for r in got] == events
    assert [r.seq for r in got] == seqs
    assert [r.subject for r in got] == [subjects.for_event(ev) for ev in events]


async def test_follower_sets_caught_up_then_sees_live_events(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js)
    for i in range(5):
        await pub.publish(status_changed(i))
    follower = Follower(nc)
    seen: list[int] = []

    async def consume() -> None:
        async for rec in follower:
            seen.append(rec.seq)
            if len(seen) == 8:
                return

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(follower.caught_up.wait(), 20)
        assert len(seen) == 5
        for i in range(5, 8):
            await pub.publish(status_changed(i))
        await asyncio.wait_for(task, 20)
    finally:
        task.cancel()
        await follower.close()
    assert seen == list(range(seen[0], seen[0] + 8))
