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

import pytest

from core import subjects
from streams.definitions import HB_STREAM, MOTOR_STREAM
from streams.errors import SequenceConflict
from streams.log import Range, StreamMissing
from tests import placed
from tests.integration.log_backends import Backend, backend, beat, leader, read_all
from tests.integration.streams_events import mixed, status_changed

__all__ = ["backend"]  # the fixture, imported for pytest

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
    assert await backend.log.last_subject_seq(MOTOR_STREAM, placed.endpoint("n7")) == s2
    assert await backend.log.last_subject_seq(MOTOR_STREAM, placed.endpoint("n9")) == 0


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
    only = await read_all(backend.log, span=Range(filter_subject=placed.endpoint("n1")))
    assert [s for s, _, _ in only] == [
        i + 1 for i, e in enumerate(events) if subjects.for_event(e) == placed.endpoint("n1")
    ]


async def test_the_message_at_a_sequence_is_the_one_stored_there(backend: Backend) -> None:
    """What a fold checks after its consumer was made again: is its last message still there?"""
    pub = backend.log.publisher()
    events = mixed(3)
    for ev in events:
        await pub.publish(ev)
    got = [d async for batch in backend.log.read(MOTOR_STREAM, Range()) for d in batch]
    stored = await backend.log.message(MOTOR_STREAM, 2)
    assert stored is not None
    assert (stored.seq, stored.subject, stored.data, stored.ts_ns) == (
        2,
        got[1].subject,
        got[1].data,
        got[1].ts_ns,
    )
    assert await backend.log.message(MOTOR_STREAM, 9) is None
    await backend.recreate(MOTOR_STREAM)
    assert await backend.log.message(MOTOR_STREAM, 2) is None


async def test_a_new_connection_has_not_reconnected(backend: Backend) -> None:
    assert backend.log.reconnects == 0
