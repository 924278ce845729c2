"""The `streams.log.Log` contract, consumers and KV (appends: test_log_contract.py): one set of cases, run against a real nats-server
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

import pytest

from core import subjects
from streams.definitions import LEADER_BUCKET, MOTOR_STREAM
from streams.errors import StreamsError
from streams.log import StreamMissing, StreamReplaced, WrongRevision
from tests.integration.log_backends import LEASE_TTL, Backend, backend, start_command
from tests.integration.streams_events import mixed, status_changed

__all__ = ["backend"]  # the fixture, imported for pytest

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
