"""Replay: ranges by seq and time, checkpoint + tail == full replay, skipped events, JSONL."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.codec import encode
from core.reducer import fold
from core.state import state_to_dict
from deploy.cmd_replay import fold_records, read_jsonl_records
from streams.checkpoint import save_checkpoint
from streams.consumer import StreamMissing
from streams.definitions import HB_STREAM, MOTOR_STREAM, ensure_streams
from streams.errors import StreamsError
from streams.jetstream import JetStreamLog
from streams.log import Range
from streams.offline import export_jsonl, fold_stream, import_jsonl
from streams.publisher import Publisher
from streams.reader import Record, read_range
from tests.bench.replay import workload
from tests.follower import Follower
from tests.integration.checkpoints import load_checkpoint
from tests.integration.streams_events import mixed, status_changed

DEADLINE = 60.0


async def _publish(js: JetStreamContext, events: list) -> list[int]:  # type: ignore[type-arg]
    pub = Publisher(js)
    return [await pub.publish(ev) for ev in events]


async def test_read_range_by_sequence(js: JetStreamContext, nc: Client) -> None:
    events = mixed(40)
    await _publish(js, events)

    got = [r.event async for r in read_range(nc, span=Range(start_seq=11, until_seq=20))]

    assert got == events[10:20]
    assert [r async for r in read_range(nc, span=Range(start_seq=41))] == []


async def test_read_range_by_time(js: JetStreamContext, nc: Client) -> None:
    events = mixed(20)
    await _publish(js, events[:10])
    await asyncio.sleep(0.05)  # stream timestamps are the server's clock: leave a clear boundary
    t_mid = time.time()
    await asyncio.sleep(0.05)
    await _publish(js, events[10:])

    after = [r.event async for r in read_range(nc, span=Range(start_time=t_mid))]
    before = [r.event async for r in read_range(nc, span=Range(until_time=t_mid))]

    assert after == events[10:]
    assert before == events[:10]


async def test_read_range_with_a_subject_filter(js: JetStreamContext, nc: Client) -> None:
    events = mixed(35)
    await _publish(js, events)

    got = [r async for r in read_range(nc, span=Range(filter_subject="motor.evt.*.n2"))]

    assert [r.event for r in got] == [e for e in events if e.data.node_id == "n2"]  # type: ignore[attr-defined]
    assert all(r.subject.endswith(".n2") for r in got)


async def test_read_range_ends_at_what_existed_when_called(js: JetStreamContext, nc: Client) -> None:
    events = mixed(30)
    await _publish(js, events[:20])
    got: list[Record] = []
    pub = Publisher(js)
    async for rec in read_range(nc):
        got.append(rec)
        if len(got) == 5:
            for ev in events[20:]:
                await pub.publish(ev)
    assert [r.event for r in got] == events[:20]


async def test_missing_stream_is_a_clear_error(js: JetStreamContext, nc: Client) -> None:
    await js.delete_stream(MOTOR_STREAM)
    with pytest.raises(StreamMissing, match="MOTOR"):
        _ = [r async for r in read_range(nc)]


async def test_checkpoint_plus_tail_equals_full_replay(js: JetStreamContext, nc: Client) -> None:
    events = list(workload(400))
    await _publish(js, events[:250])
    head, _ = await fold_stream(nc)
    await save_checkpoint(JetStreamLog.of(js), "controller", head)
    await _publish(js, events[250:])

    loaded = await load_checkpoint(JetStreamLog.of(js), "controller")
    assert loaded is not None and loaded.last_seq == 250
    resumed, tail_stats = await fold_stream(nc, state=loaded)
    full, full_stats = await fold_stream(nc)

    assert tail_stats.first_seq == 251 and tail_stats.applied == 150
    assert full_stats.applied == 400
    assert state_to_dict(resumed) == state_to_dict(full)
    # And the fold is the same fold core offers for in-memory events.
    assert state_to_dict(full) == state_to_dict(fold(enumerate(events, 1)))


async def test_fold_to_a_sequence(js: JetStreamContext, nc: Client) -> None:
    events = list(workload(120))
    await _publish(js, events)

    part, stats = await fold_stream(nc, until_seq=70)

    assert stats.last_seq == 70 and stats.applied == 70
    assert state_to_dict(part) == state_to_dict(fold(enumerate(events[:70], 1)))


async def test_bad_events_are_skipped_and_counted(js: JetStreamContext, nc: Client) -> None:
    good = mixed(6)
    pub = Publisher(js)
    await pub.publish(good[0])
    await js.publish("motor.evt.node.x", b"\x00not json")
    await pub.publish(good[1])
    unknown = orjson.loads(encode(good[2])) | {"type": "node.teleported", "id": "u1"}
    await js.publish("motor.evt.node.x", orjson.dumps(unknown))
    newer = orjson.loads(encode(good[3])) | {"schema_version": 99, "id": "v99"}
    await js.publish("motor.evt.node.x", orjson.dumps(newer))
    for ev in good[2:]:
        await pub.publish(ev)

    state, stats = await fold_stream(nc)
    assert stats.applied == 6 and stats.skipped == 3
    assert dict(stats.skip_reasons) == {"undecodable": 1, "unknown_type": 1, "newer_schema": 1}
    assert state.events_applied == 6

    follower = Follower(nc)
    got: list[Record] = []
    try:
        async for rec in follower:
            got.append(rec)
            if len(got) == 6:
                break
    finally:
        await follower.close()
    assert [r.event for r in got] == good
    assert follower.skipped == 3
    assert follower.skip_reasons == {"undecodable": 1, "unknown_type": 1, "newer_schema": 1}


async def test_export_import_round_trip(js: JetStreamContext, nc: Client, tmp_path: Path) -> None:
    events = list(workload(150))
    await _publish(js, events)
    await js.publish("motor.evt.node.x", b"\x00not json")  # exported verbatim, skipped by folds
    hb_seq = (await js.publish("motor.hb.node-001", b'{"partial": true}')).seq
    original, original_stats = await fold_stream(nc)
    path = tmp_path / "incident.jsonl"

    n = await export_jsonl(nc, path, streams=(MOTOR_STREAM, HB_STREAM))

    assert n == 152
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert {tuple(sorted(line)) for line in lines} == {("event", "seq", "stream", "subject", "time")}
    assert lines[-1]["stream"] == HB_STREAM and lines[-1]["seq"] == hb_seq
    # Folded from the file as `motor replay --file` folds it.
    records, skipped = read_jsonl_records(path)
    from_file, skipped = fold_records(records, skipped)
    assert state_to_dict(from_file) == state_to_dict(original)
    assert (len(records), len(skipped)) == (150, 1)

    # Elsewhere: a fresh stream gets the same messages back, the garbage one included.
    for name in (MOTOR_STREAM, HB_STREAM):
        await js.delete_stream(name)
    await ensure_streams(js)
    assert await import_jsonl(js, path) == 152
    reimported, again_stats = await fold_stream(nc)
    assert state_to_dict(reimported) == state_to_dict(original)
    assert (again_stats.applied, again_stats.skipped) == (150, 1)
    assert [r.event async for r in read_range(nc)] == events
    assert (await js.stream_info(HB_STREAM)).state.messages == 1
    # Importing again within the dedupe window adds nothing.
    await import_jsonl(js, path)
    assert (await js.stream_info(MOTOR_STREAM)).state.messages == 151
    assert original_stats.skipped == 1


async def test_import_names_the_bad_line(js: JetStreamContext, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = orjson.dumps(
        {
            "stream": "MOTOR",
            "seq": 1,
            "subject": "motor.evt.endpoint.n1",
            "event": orjson.loads(encode(status_changed(1))),
        }
    )
    path.write_bytes(good + b"\n{oops\n")
    with pytest.raises(StreamsError, match=r"bad\.jsonl:2"):
        await import_jsonl(js, path)
