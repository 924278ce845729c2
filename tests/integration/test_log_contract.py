"""The `streams.log.Log` contract: one set of cases, run against a real nats-server
(`JetStreamLog`) and against the memory log the simulator runs on (`MemoryLog`).

Every promise the simulator's verdicts rest on is a case here — sequences and order, the
dedupe window, subject guards and the leader fence, atomic batches, the last message per
subject, ordered consumers (filters, pending, live delivery, a stream deleted or created
again under them), KV revisions and TTL, the durable consumer's ack, nak, term, ack wait and
rebinding — so a memory log that drifted from JetStream fails here, against the real server,
before any simulated run can be believed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from core import subjects
from core.events import (
    EndpointLoad,
    EndpointStatus,
    Heartbeat,
    HeartbeatData,
    LeaderChanged,
    LeaderChangedData,
    Role,
    StartCommand,
    StartCommandData,
)
from core.ids import derive_id, new_id
from streams.connection import connect
from streams.definitions import HB_STREAM, LEADER_BUCKET, MOTOR_STREAM, ensure_streams
from streams.errors import SequenceConflict, StreamsError
from streams.jetstream import JetStreamLog
from streams.log import Log, StreamMissing, StreamReplaced, WrongRevision
from streams.memory import MemoryLog, MemoryServer
from streams.reader import Range
from streams.server import EmbeddedNats
from tests.integration.streams_events import mixed, status_changed

LEASE_TTL = 1.0


@dataclass
class Backend:
    """One implementation under test: its first client, more clients, and the server's faults."""

    name: str
    log: Log
    more: Callable[[], Awaitable[Log]]
    recreate: Callable[[str], Awaitable[None]]
    advance: Callable[[float], Awaitable[None]]  # let the server's clock move on
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


@pytest_asyncio.fixture(loop_scope="session", params=["jetstream", "memory"])
async def backend(request: pytest.FixtureRequest, nats_server: EmbeddedNats) -> AsyncIterator[Backend]:
    if request.param == "memory":
        offset = [0.0]
        server = MemoryServer(clock=lambda: time.time() + offset[0])
        server.ensure_streams(lease_ttl=LEASE_TTL)

        async def more() -> Log:
            return MemoryLog(server)

        async def recreate(stream: str) -> None:
            server.recreate(stream)

        async def advance(seconds: float) -> None:
            offset[0] += seconds
            await asyncio.sleep(0)

        yield Backend("memory", MemoryLog(server), more, recreate, advance)
        return
    nc = await connect(nats_server.url, name="pytest-contract")
    js = nc.jetstream()
    await _fresh(js)
    b = Backend(
        "jetstream",
        JetStreamLog(nc),
        lambda: _client(b, nats_server.url),
        lambda s: _recreate(js, s),
        asyncio.sleep,
    )
    try:
        yield b
    finally:
        for close in b.closers:
            with contextlib.suppress(Exception):
                await close()
        await nc.close()


async def _fresh(js: JetStreamContext) -> None:
    from tests.conftest import ALL_STREAMS

    for name in ALL_STREAMS:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    await ensure_streams(js, lease_ttl=LEASE_TTL)


async def _client(b: Backend, url: str) -> Log:
    nc = await connect(url, name="pytest-contract-more")
    b.closers.append(nc.close)
    return JetStreamLog(nc)


async def _recreate(js: JetStreamContext, stream: str) -> None:
    await js.delete_stream(stream)
    await ensure_streams(js, lease_ttl=LEASE_TTL)


def leader(term: int, who: str = "c1") -> LeaderChanged:
    return LeaderChanged(
        id=derive_id("contract-leader", who, term),
        ts=1_700_000_000.0 + term,
        source=f"controller/{who}",
        data=LeaderChangedData(leader_id=who, term=term),
    )


def start_command(node: str) -> StartCommand:
    data = StartCommandData(
        command_id=new_id(), node_id=node, instance_id=7, job_name="motor", role=Role.UNION,
        engine_type="builtin", model="m", endpoints=(), master_dp_ip="127.0.0.1",
    )  # fmt: skip
    return StartCommand(id=new_id(), ts=time.time(), source="test/controller", data=data)


def beat(node: str, i: int) -> Heartbeat:
    data = HeartbeatData(
        node_id=node, endpoints=(EndpointLoad(id=0, status=EndpointStatus.READY, running=i),)
    )
    return Heartbeat(
        id=derive_id("contract-hb", node, i), ts=1_700_000_000.0 + i, source=f"nodeagent/{node}", data=data
    )


async def read_all(
    log: Log, stream: str = MOTOR_STREAM, span: Range = Range()
) -> list[tuple[int, str, bytes]]:
    return [(d.seq, d.subject, d.data) async for batch in log.read(stream, span) for d in batch]


# --------------------------------------------------------------------------- appending


async def test_sequences_follow_the_order_of_appends(backend: Backend) -> None:
    pub = backend.log.publisher()
    events = mixed(12)
    seqs = [await pub.publish(ev) for ev in events]
    assert seqs == list(range(1, 13))
    got = await read_all(backend.log)
    assert [s for s, _, _ in got] == seqs
    assert [subj for _, subj, _ in got] == [subjects.for_event(e) for e in events]


async def test_a_copy_within_the_dedupe_window_answers_the_originals_sequence(backend: Backend) -> None:
    pub = backend.log.publisher()
    ev = status_changed(1)
    first = await pub.publish(ev)
    await pub.publish(status_changed(2))
    assert await pub.publish(ev) == first
    assert (await backend.log.stream_info(MOTOR_STREAM)).messages == 2


async def test_a_subject_guard_refuses_once_the_subject_moved(backend: Backend) -> None:
    pub = backend.log.publisher()
    s1 = await pub.publish(status_changed(0, node="n7"), expected_last_subject_seq=0)
    s2 = await pub.publish(status_changed(1, node="n7"), expected_last_subject_seq=s1)
    with pytest.raises(SequenceConflict):
        await pub.publish(status_changed(2, node="n7"), expected_last_subject_seq=s1)
    await pub.publish(status_changed(3, node="n8"), expected_last_subject_seq=0)
    assert await backend.log.last_subject_seq(MOTOR_STREAM, subjects.endpoint("n7")) == s2
    assert await backend.log.last_subject_seq(MOTOR_STREAM, subjects.endpoint("n9")) == 0


async def test_the_fence_refuses_a_deposed_leaders_write(backend: Backend) -> None:
    pub = backend.log.publisher()
    fence = await pub.publish(leader(1), expected_last_subject_seq=0)
    ok = await pub.publish(
        status_changed(0), expected_last_subject_seq=fence, expected_subject=subjects.LEADER
    )
    assert ok == fence + 1
    await pub.publish(leader(2, "c2"), expected_last_subject_seq=fence)
    with pytest.raises(SequenceConflict):
        await pub.publish(
            status_changed(1), expected_last_subject_seq=fence, expected_subject=subjects.LEADER
        )


async def test_a_guard_is_checked_before_the_dedupe_window(backend: Backend) -> None:
    """A decision sent again after its leader was deposed is refused, not answered as the
    duplicate it is (found by this contract: the memory log had it the other way round)."""
    pub = backend.log.publisher()
    fence = await pub.publish(leader(1), expected_last_subject_seq=0)
    decision = status_changed(0)
    seq = await pub.publish(decision, expected_last_subject_seq=fence, expected_subject=subjects.LEADER)
    await pub.publish(leader(2, "c2"), expected_last_subject_seq=fence)
    with pytest.raises(SequenceConflict):
        await pub.publish(decision, expected_last_subject_seq=fence, expected_subject=subjects.LEADER)
    assert await pub.publish(decision) == seq  # unguarded, the window still knows it


async def test_a_batch_lands_contiguously_or_not_at_all(backend: Backend) -> None:
    pub = backend.log.publisher()
    fence = await pub.publish(leader(1), expected_last_subject_seq=0)
    events = mixed(5)
    got = await pub.publish_batch(events, expected_last_subject_seq=fence, expected_subject=subjects.LEADER)
    assert got == list(range(fence + 1, fence + 6))
    await pub.publish(leader(2, "c2"), expected_last_subject_seq=fence)
    refused = await pub.publish_batch(
        mixed(12)[5:], expected_last_subject_seq=fence, expected_subject=subjects.LEADER
    )
    assert refused and all(isinstance(o, SequenceConflict) for o in refused)
    assert (await backend.log.stream_info(MOTOR_STREAM)).last_seq == fence + 6


async def test_a_batch_holding_a_stored_event_goes_one_by_one_deduplicated(backend: Backend) -> None:
    pub = backend.log.publisher()
    events = mixed(4)
    stored = await pub.publish(events[1])
    got = await pub.publish_batch(events)
    assert got[1] == stored
    assert all(isinstance(o, int) for o in got)
    assert (await backend.log.stream_info(MOTOR_STREAM)).messages == 4


async def test_a_batch_behind_a_moved_fence_is_refused_whatever_it_holds(backend: Backend) -> None:
    """Inside a batch the server looks at each message's id before its guard: a stored first
    message makes it go one by one (refused at the first), a later one leaves the fence to refuse
    it whole. Either way nothing lands."""
    pub = backend.log.publisher()
    fence = await pub.publish(leader(1), expected_last_subject_seq=0)
    events = mixed(4)
    await pub.publish(events[0])
    await pub.publish(events[2])
    await pub.publish(leader(2, "c2"), expected_last_subject_seq=fence)
    first = await pub.publish_batch(events, expected_last_subject_seq=fence, expected_subject=subjects.LEADER)
    assert len(first) == 1 and isinstance(first[0], SequenceConflict)
    later = await pub.publish_batch(
        events[1:], expected_last_subject_seq=fence, expected_subject=subjects.LEADER
    )
    assert len(later) == 3 and all(isinstance(o, SequenceConflict) for o in later)
    assert (await backend.log.stream_info(MOTOR_STREAM)).last_seq == 4


async def test_heartbeats_keep_the_last_message_of_each_node(backend: Backend) -> None:
    pub = backend.log.publisher()
    for i in range(3):
        await pub.publish(beat("a", i))
        await pub.publish(beat("b", i))
    view = await backend.log.stream_info(HB_STREAM)
    assert view.messages == 2
    got = await read_all(backend.log, HB_STREAM)
    assert [subj for _, subj, _ in got] == [subjects.heartbeat("a"), subjects.heartbeat("b")]
    assert [s for s, _, _ in got] == [5, 6]


# --------------------------------------------------------------------------- stream info


async def test_stream_info_tells_bounds_and_incarnation(backend: Backend) -> None:
    log = backend.log
    empty = await log.stream_info(MOTOR_STREAM)
    assert (empty.first_seq, empty.last_seq, empty.messages) == (0, 0, 0)
    pub = log.publisher()
    for ev in mixed(3):
        await pub.publish(ev)
    view = await log.stream_info(MOTOR_STREAM)
    assert (view.first_seq, view.last_seq, view.messages) == (1, 3, 3)
    assert view.first_ts is not None and view.last_ts is not None and view.now >= view.last_ts - 1
    await backend.recreate(MOTOR_STREAM)
    again = await log.stream_info(MOTOR_STREAM)
    assert again.created != view.created and again.last_seq == 0
    with pytest.raises(StreamMissing):
        await log.stream_info("NO_SUCH_STREAM")


async def test_a_range_reads_from_a_sequence_up_to_one_on_a_filter(backend: Backend) -> None:
    pub = backend.log.publisher()
    events = mixed(10)
    for ev in events:
        await pub.publish(ev)
    got = await read_all(backend.log, span=Range(start_seq=3, until_seq=8))
    assert [s for s, _, _ in got] == [3, 4, 5, 6, 7, 8]
    only = await read_all(backend.log, span=Range(filter_subject=subjects.endpoint("n1")))
    assert [s for s, _, _ in only] == [
        i + 1 for i, e in enumerate(events) if subjects.for_event(e) == subjects.endpoint("n1")
    ]


# --------------------------------------------------------------------------- ordered consumers


async def test_an_ordered_consumer_hands_out_each_message_once_then_follows(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    for ev in mixed(6):
        await pub.publish(ev)
    oc = log.ordered(MOTOR_STREAM, start_seq=3)
    started: list[int] = []
    oc.on_start = started.append
    assert await oc.start() == 4
    seen: list[tuple[int, int]] = []
    while len(seen) < 4:
        seen += [(d.seq, d.pending) for d in await oc.next_batch()]
    assert seen == [(3, 3), (4, 2), (5, 1), (6, 0)]
    assert started == [4] and oc.delivering
    later = asyncio.create_task(oc.next_batch())
    await asyncio.sleep(0.05)
    assert not later.done()
    await pub.publish(status_changed(99))
    async with asyncio.timeout(5):
        batch = await later
    assert [(d.seq, d.pending) for d in batch] == [(7, 0)]
    assert oc.last_seq == 7
    await oc.close()


async def test_an_ordered_consumer_on_a_filter_counts_only_what_matches(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    await pub.publish(start_command("n1"))
    for ev in mixed(3):
        await pub.publish(ev)
    oc = log.ordered(MOTOR_STREAM, filter_subject=subjects.ALL_EVENTS)
    assert await oc.start() == 3
    batch = await oc.next_batch()
    assert [d.seq for d in batch] == [2, 3, 4] and batch[-1].pending == 0
    await oc.close()


async def test_an_ordered_consumer_of_a_missing_or_recreated_stream_says_which(backend: Backend) -> None:
    log = backend.log
    with pytest.raises(StreamMissing):
        await log.ordered("NO_SUCH_STREAM").start()
    created = (await log.stream_info(MOTOR_STREAM)).created
    await backend.recreate(MOTOR_STREAM)
    with pytest.raises(StreamReplaced):
        await log.ordered(MOTOR_STREAM, expect_created=created).start()


async def test_a_stream_created_again_under_a_consumer_ends_its_reading(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    await pub.publish(status_changed(0))
    created = (await log.stream_info(MOTOR_STREAM)).created
    oc = log.ordered(MOTOR_STREAM, idle_heartbeat=0.5, expect_created=created)
    await oc.start()
    assert [d.seq for d in await oc.next_batch()] == [1]
    waiting = asyncio.create_task(oc.next_batch())
    await asyncio.sleep(0.05)
    await backend.recreate(MOTOR_STREAM)
    with pytest.raises((StreamReplaced, StreamMissing)):
        async with asyncio.timeout(10):
            await waiting
    await oc.close()


# --------------------------------------------------------------------------- KV


async def test_kv_revisions_guard_every_write(backend: Backend) -> None:
    kv = backend.log.kv(LEADER_BUCKET)
    r1 = await kv.create("k", b"one")
    with pytest.raises(WrongRevision):
        await kv.create("k", b"two")
    r2 = await kv.update("k", b"two", last=r1)
    assert r2 > r1
    with pytest.raises(WrongRevision):
        await kv.update("k", b"three", last=r1)
    got = await kv.get("k")
    assert got is not None and (got.value, got.revision) == (b"two", r2)
    with pytest.raises(WrongRevision):
        await kv.delete("k", last=r1)
    await kv.delete("k", last=r2)
    assert await kv.get("k") is None
    r3 = await kv.create("k", b"again")  # a deleted key is free
    assert r3 > r2 and await kv.get("nobody") is None
    r4 = await kv.put("k", b"whatever")
    assert (await kv.get("k")).revision == r4  # type: ignore[union-attr]


async def test_a_lease_key_is_free_once_its_ttl_ran_out(backend: Backend) -> None:
    kv = backend.log.kv(LEADER_BUCKET)
    await kv.create("leader", b"c1")
    with pytest.raises(WrongRevision):
        await kv.create("leader", b"c2")
    await backend.advance(LEASE_TTL + 1.0)
    assert await kv.get("leader") is None
    await kv.create("leader", b"c2")


# --------------------------------------------------------------------------- durable consumers


async def _next(d: object, within: float = 5.0) -> list:  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        got = await d.fetch(0.5)  # type: ignore[attr-defined]
        if got:
            return got  # type: ignore[no-any-return]
    return []


async def test_a_durable_hands_out_one_message_at_a_time_until_acked(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    await pub.publish(start_command("gone"))  # before the consumer: not its business
    d = await log.durable(
        MOTOR_STREAM, "contract-a", filter_subject=subjects.node_commands("n1"), ack_wait=30.0
    )
    s1 = await pub.publish(start_command("n1"))
    s2 = await pub.publish(start_command("n1"))
    await pub.publish(start_command("n2"))
    [m1] = await _next(d)
    assert (m1.seq, m1.delivered) == (s1, 1)
    assert await d.fetch(0.3) == []  # one outstanding at a time
    await m1.ack(2.0)
    [m2] = await _next(d)
    assert m2.seq == s2
    await m2.term()
    assert await d.fetch(0.5) == []
    await d.close()


async def test_a_nak_or_a_lapsed_ack_wait_delivers_again(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    d = await log.durable(
        MOTOR_STREAM, "contract-b", filter_subject=subjects.node_commands("n1"), ack_wait=1.0
    )
    seq = await pub.publish(start_command("n1"))
    [m] = await _next(d)
    await m.nak(delay=0.3)
    [again] = await _next(d)
    assert (again.seq, again.delivered) == (seq, 2)
    # Not acked: after the ack wait it goes out once more.
    [third] = await _next(d, within=5.0)
    assert (third.seq, third.delivered) == (seq, 3)
    await third.ack(2.0)
    assert await d.fetch(1.5) == []
    await d.close()


async def test_a_durable_outlives_its_client_and_goes_with_its_stream(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    d = await log.durable(
        MOTOR_STREAM, "contract-c", filter_subject=subjects.node_commands("n1"), ack_wait=1.0
    )
    seq = await pub.publish(start_command("n1"))
    [m] = await _next(d)
    await d.close()  # the client dies with the message unacked
    other = await backend.more()
    d2 = await other.durable(
        MOTOR_STREAM, "contract-c", filter_subject=subjects.node_commands("n1"), ack_wait=1.0
    )
    [again] = await _next(d2)
    assert (again.seq, again.delivered) == (seq, 2) and m.seq == seq
    await again.ack(2.0)
    assert await d2.exists()
    await backend.recreate(MOTOR_STREAM)
    assert not await d2.exists()
    with contextlib.suppress(StreamsError):
        assert await d2.fetch(0.5) == []
    await d2.close()


async def test_a_durable_made_again_reads_from_a_time(backend: Backend) -> None:
    log = backend.log
    pub = log.publisher()
    await pub.publish(start_command("n1"))
    since = (await log.stream_info(MOTOR_STREAM)).now
    await asyncio.sleep(0.05)
    seq = await pub.publish(start_command("n1"))
    d = await log.durable(
        MOTOR_STREAM,
        "contract-d",
        filter_subject=subjects.node_commands("n1"),
        ack_wait=30.0,
        start_time=since,
    )
    [m] = await _next(d)
    assert m.seq == seq
    await m.ack(2.0)
    await d.close()


async def test_the_log_answers_and_says_it_is_connected(backend: Backend) -> None:
    assert backend.log.connected
    assert await backend.log.answers(2.0)
    await backend.log.ensure_streams(lease_ttl=LEASE_TTL)  # safe on every start
