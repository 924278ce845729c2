"""LiveFold on a real nats-server: poison, NATS outages, a stream away, purge, delete-and-recreate, age-out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from core import subjects
from core.codec import encode
from core.events import Heartbeat, HeartbeatData
from core.ids import new_id
from streams.connection import connect
from streams.definitions import HB_STREAM, MOTOR_STREAM, ensure_streams
from streams.jetstream import JetStreamLog
from streams.livefold import LiveFold
from streams.lostlog import Loss
from streams.poison import Skipped
from streams.publisher import Publisher
from streams.reader import Record
from streams.server import EmbeddedNats
from tests.integration.streams_events import mixed, status_changed


def heartbeat(node: str) -> Heartbeat:
    """A heartbeat of `node` (on its own subject: a fold believes nothing else there)."""
    return Heartbeat(
        id=new_id(), ts=time.time(), source=f"nodeagent/{node}", data=HeartbeatData(node_id=node)
    )


DEADLINE = 60.0


class Sink:
    """Apply callbacks that keep what they were given, and waits on it."""

    def __init__(self, poison_ids: frozenset[str] = frozenset()) -> None:
        self.records: list[Record] = []
        self.beats: list[Record] = []
        self.lost: list[str] = []
        self.skipped: list[Skipped] = []
        self.poison_ids = poison_ids
        self._changed = asyncio.Event()

    def apply(self, rec: Record) -> None:
        if rec.event.id in self.poison_ids:
            raise KeyError("id")  # what the reducer raised on issue 11's refresh event
        self.records.append(rec)
        self._changed.set()

    def beat(self, rec: Record) -> None:
        self.beats.append(rec)
        self._changed.set()

    def on_lost(self, reason: Loss) -> None:
        self.lost.append(str(reason))
        self.records.clear()  # what a fold rebuilt from the log does
        self._changed.set()

    def on_skip(self, s: Skipped) -> None:
        self.skipped.append(s)

    async def until(self, pred: Callable[[], bool], within: float = DEADLINE, what: str = "") -> None:
        async with asyncio.timeout(within):
            while not pred():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):  # also re-checks state changed by other tasks
                        await self._changed.wait()
        assert pred(), what

    def seqs(self) -> list[int]:
        return [r.seq for r in self.records]


async def until(pred: Callable[[], bool], within: float = DEADLINE) -> None:
    """Poll a condition nothing can be awaited for."""
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def fold_of(nc: Client, sink: Sink, **kw: Any) -> LiveFold:
    kw.setdefault("check_interval", 0.3)
    kw.setdefault("idle_heartbeat", 0.5)
    return LiveFold(JetStreamLog(nc), sink.apply, on_lost=sink.on_lost, on_skip=sink.on_skip, **kw)


async def test_poison_events_are_skipped_counted_and_the_fold_goes_on(
    js: JetStreamContext, nc: Client
) -> None:
    good = mixed(8)
    pub = Publisher(js)
    await pub.publish(good[0])
    await js.publish("motor.evt.node.x", b"\x00not json")
    await pub.publish(good[1])
    unknown = orjson.loads(encode(good[2])) | {"type": "node.teleported", "id": "u1"}
    await js.publish("motor.evt.node.x", orjson.dumps(unknown))
    newer = orjson.loads(encode(good[3])) | {"schema_version": 99, "id": "v99"}
    await js.publish("motor.evt.node.x", orjson.dumps(newer))
    nan = orjson.loads(encode(good[3])) | {"id": "nan", "ts": "@TS@"}
    await js.publish("motor.evt.node.x", orjson.dumps(nan).replace(b'"@TS@"', b"NaN"))
    for ev in good[2:5]:
        await pub.publish(ev)
    sink = Sink(poison_ids=frozenset({good[4].id}))
    fold = fold_of(nc, sink)
    await fold.start()
    try:
        await asyncio.wait_for(fold.caught_up.wait(), DEADLINE)
        assert [r.event for r in sink.records] == good[:4]
        assert fold.skipped == {"undecodable": 2, "unknown_type": 1, "newer_schema": 1, "inapplicable": 1}
        assert [(s.seq, s.reason) for s in sink.skipped] == [
            (2, "undecodable"),
            (4, "unknown_type"),
            (5, "newer_schema"),
            (6, "undecodable"),
            (9, "inapplicable"),
        ]
        assert "KeyError" in sink.skipped[-1].detail and fold.position == 9
        # Live events after the poison are folded too, and `wait_for` passes a skipped seq.
        assert await fold.wait_for(9, 1.0)
        seq = 0
        for ev in good[5:]:
            seq = await pub.publish(ev)
        assert await fold.wait_for(seq, DEADLINE)
        assert [r.event for r in sink.records] == good[:4] + good[5:]
        health = fold.health()
        assert health.following and health.caught_up and health.position == seq and health.lost == 0
    finally:
        await fold.close()


async def test_wait_for_times_out_and_is_released_in_order(js: JetStreamContext, nc: Client) -> None:
    sink = Sink()
    fold = fold_of(nc, sink)
    await fold.start()
    try:
        await asyncio.wait_for(fold.caught_up.wait(), DEADLINE)
        assert not await fold.wait_for(1, 0.05)
        waiter = asyncio.ensure_future(fold.wait_for(2, DEADLINE))
        pub = Publisher(js)
        await pub.publish(status_changed(1))
        await pub.publish(status_changed(2))
        assert await waiter
    finally:
        await fold.close()


@pytest_asyncio.fixture(loop_scope="session")
async def private_nats(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    """A nats-server of this test alone, to kill, freeze and restart on the same store."""
    server = EmbeddedNats(tmp_path / "nats", log_file=tmp_path / "nats.log")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_nats_killed_and_restarted_later_the_fold_resumes_without_gap(
    private_nats: EmbeddedNats,
) -> None:
    nc = await connect(private_nats.url, name="livefold-outage", retry_initial=True)
    fold = None
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        events = mixed(40)
        pub = Publisher(js)
        for ev in events[:20]:
            await pub.publish(ev)
        await js.publish(subjects.heartbeat("n1"), encode(heartbeat("n1")))
        sink = Sink()
        fold = LiveFold(
            JetStreamLog(nc),
            sink.apply,
            heartbeats=sink.beat,
            on_lost=sink.on_lost,
            check_interval=0.3,
            idle_heartbeat=0.5,
        )
        await fold.start()
        await asyncio.wait_for(fold.caught_up.wait(), DEADLINE)
        assert len(sink.beats) == 1
        heard = fold.hearing_since
        assert fold.hearing
        await private_nats.kill()
        down = time.time()
        await until(lambda: not fold.hearing, within=5.0)  # deaf at once: a caller judges nobody now
        await asyncio.sleep(8.0)  # longer than every consumer's heartbeat check: all of them give up once
        assert not fold.health().connected and not fold.hearing
        await private_nats.start()
        await until(lambda: nc.is_connected)  # nats-py reconnects on its own timer
        for ev in events[20:]:
            await pub.publish(ev)
        await js.publish(subjects.heartbeat("n2"), encode(heartbeat("n2")))
        await sink.until(lambda: len(sink.records) == 40 and len(sink.beats) >= 2, what="resumed")
        assert sink.seqs() == list(range(1, 41)), "gap or duplicate"
        assert [r.event for r in sink.records] == events and sink.lost == []
        assert fold.hearing_since > down > heard and fold.hearing
        health = fold.health()
        assert health.following and health.resets >= 1 and health.position == 40
    finally:
        if fold is not None:
            await fold.close()
        await nc.close()


async def test_stream_deleted_and_created_again_fold_starts_over(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js)
    for ev in mixed(30):
        await pub.publish(ev)
    sink = Sink()
    fold = fold_of(nc, sink, heartbeats=sink.beat)
    await fold.start()
    try:
        await asyncio.wait_for(fold.caught_up.wait(), DEADLINE)
        assert fold.position == 30
        await js.delete_stream(MOTOR_STREAM)
        await js.delete_stream(HB_STREAM)
        await asyncio.sleep(2.0)  # the stream stays away a while: the fold waits, it does not end
        assert not fold.health().following
        await ensure_streams(js)
        fresh = [status_changed(i, node="z") for i in range(100, 105)]
        for ev in fresh:
            await pub.publish(ev)
        await sink.until(lambda: len(sink.records) == 5, what="new stream folded")
        assert sink.seqs() == [1, 2, 3, 4, 5] and [r.event for r in sink.records] == fresh
        assert len(sink.lost) == 1 and "created again" in sink.lost[0]
        await js.publish(subjects.heartbeat("n7"), encode(heartbeat("n7")))
        await sink.until(lambda: len(sink.beats) == 1, what="heartbeats of the new MOTOR_HB")
        assert fold.caught_up.is_set() and fold.health().lost == 1
    finally:
        await fold.close()


async def test_purge_under_a_running_fold_starts_it_over_from_what_the_stream_holds(
    js: JetStreamContext, nc: Client
) -> None:
    pub = Publisher(js)
    for ev in mixed(30):
        await pub.publish(ev)
    sink = Sink()
    fold = fold_of(nc, sink, filter_subject=subjects.ALL_EVENTS)
    await fold.start()
    try:
        await asyncio.wait_for(fold.caught_up.wait(), DEADLINE)
        await js.purge_stream(MOTOR_STREAM)
        after = [status_changed(i, node="p") for i in range(200, 203)]
        for ev in after:
            await pub.publish(ev)
        await sink.until(lambda: len(sink.lost) == 1 and len(sink.records) == 3, what="refolded after purge")
        assert "purged" in sink.lost[0]
        assert sink.seqs() == [31, 32, 33] and [r.event for r in sink.records] == after
        # A further event lands on the fresh fold once, and nothing is lost again.
        seq = await pub.publish(status_changed(300, node="p"))
        assert await fold.wait_for(seq, DEADLINE)
        await asyncio.sleep(1.0)  # several checks
        assert sink.seqs() == [31, 32, 33, 34] and fold.lost == 1
    finally:
        await fold.close()


async def test_age_out_is_not_a_lost_log(js: JetStreamContext, nc: Client) -> None:
    name = "AGED_TEST"
    await js.add_stream(StreamConfig(name=name, subjects=["aged.>"], max_age=1.5))
    try:
        for i in range(5):
            await js.publish(f"aged.n{i}", encode(status_changed(i)))
        sink = Sink()
        fold = fold_of(nc, sink, stream=name)
        await fold.start()
        try:
            await sink.until(lambda: len(sink.records) == 5)
            deadline = time.monotonic() + DEADLINE
            while (info := await js.stream_info(name)).state.messages:  # the server expires on its timer
                assert time.monotonic() < deadline, "messages did not age out"
                await asyncio.sleep(0.2)
            assert info.state.first_seq == 6
            await asyncio.sleep(1.0)  # several checks after the age-out
            assert sink.lost == [] and fold.lost == 0
            await js.publish("aged.x", encode(status_changed(9)))
            await sink.until(lambda: len(sink.records) == 6)
        finally:
            await fold.close()
    finally:
        await js.delete_stream(name)


async def test_events_folded_while_the_stream_check_travels_are_not_a_lost_log(
    js: JetStreamContext, nc: Client
) -> None:
    """Regression: the check read the fold's position after the server's answer, so an event
    folded meanwhile made the log look rewound and the fold started over from seq 1."""
    sink = Sink()
    fold = fold_of(nc, sink, check_interval=0.005)
    await fold.start()
    try:
        await asyncio.wait_for(fold.caught_up.wait(), DEADLINE)
        pub = Publisher(js)
        seq = 0
        for i in range(1500):
            seq = await pub.publish(status_changed(i))
        assert await fold.wait_for(seq, DEADLINE)
        assert sink.lost == [] and fold.lost == 0
        assert sink.seqs() == sorted(set(sink.seqs()))
    finally:
        await fold.close()
