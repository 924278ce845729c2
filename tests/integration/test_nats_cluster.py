"""A real 3-node JetStream cluster (`motor up --nats-cluster 3`'s servers): streams and KV
buckets at replicas 3, the MOTOR leader killed -9 under acked publishing loses nothing and
comes back current, and a minority acknowledges nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from core.config import NatsConfig
from core.events import FaultCleared, FaultClearedData
from deploy.hosts import LOCAL
from deploy.natscluster import NatsCluster, plan_members
from streams.ackjournal import AckJournal, audit, event_id, read_journal
from streams.connection import connect
from streams.definitions import MOTOR_STREAM, ensure_streams, stream_configs
from streams.errors import StreamsError
from streams.jetstream import JetStreamLog
from streams.placement import StreamPlacement, stream_placement
from streams.publisher import Publisher
from streams.reader import read_deliveries
from tests.localcluster import free_ports


@pytest_asyncio.fixture(loop_scope="session")
async def cluster3(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    ports = free_ports(0, nats_servers=3)
    members = plan_members(
        3, [LOCAL], port=ports.nats, monitor_port=ports.nats_monitor, route_port=ports.nats_route
    )
    cluster = NatsCluster(tmp_path, members, tmp_path / "logs", route_password="route-secret")
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


def _event(i: int) -> FaultCleared:
    return FaultCleared(
        id=f"probe-{i}",
        ts=time.time(),
        source="test",
        data=FaultClearedData(fault_id=f"f{i}", node_id="n1", reason="probe"),
    )


async def _placement_where(js: object, what: str, pred: object, within: float = 30.0) -> StreamPlacement:
    deadline = time.monotonic() + within
    last: StreamPlacement | None = None
    while time.monotonic() < deadline:
        last = await stream_placement(js, MOTOR_STREAM)  # type: ignore[arg-type]
        if pred(last):  # type: ignore[operator]
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last placement: {last}")


async def test_every_stream_and_bucket_is_replicated_on_three_servers(cluster3: NatsCluster) -> None:
    nc = await connect(cluster3.urls, name="r3")
    try:
        js = nc.jetstream()
        await ensure_streams(js, NatsConfig(replicas=3))
        for want in stream_configs(NatsConfig(replicas=3)):
            assert want.name is not None
            info = await js.stream_info(want.name)
            assert info.config.num_replicas == 3, want.name
            assert info.cluster is not None and info.cluster.leader in {"n1", "n2", "n3"}, want.name
            assert len(info.cluster.replicas or []) == 2, want.name
        placed = await _placement_where(
            js, "both followers current", lambda p: p.leader and all(r.current for r in p.followers)
        )
        assert placed.describe().startswith(f"MOTOR leader {placed.leader} · ")
        assert placed.describe().endswith("(R3)")
    finally:
        await nc.close()


async def test_the_motor_leader_killed_under_acked_publishing_loses_no_acked_event(
    cluster3: NatsCluster, tmp_path: Path
) -> None:
    nc = await connect(cluster3.urls, name="publisher")
    try:
        js = nc.jetstream()
        await ensure_streams(js, NatsConfig(replicas=3))
        journal = tmp_path / "acks"
        pub = Publisher(js, ack_timeout=2.0, journal=AckJournal(journal / "publisher.jsonl"))
        before = await stream_placement(js, MOTOR_STREAM)
        assert before.leader is not None
        failures = 0

        async def publish_all(n: int) -> None:
            # As our components do: a publish that got no ack is sent again with the same id.
            nonlocal failures
            for i in range(n):
                ev = _event(i)
                while True:
                    try:
                        await pub.publish(ev)
                        break
                    except StreamsError:
                        failures += 1
                        await asyncio.sleep(0.1)

        task = asyncio.create_task(publish_all(400))
        await asyncio.sleep(0.5)
        await cluster3.server(before.leader).kill()
        after = await _placement_where(
            js, "a new MOTOR leader", lambda p: p.leader is not None and p.leader != before.leader
        )
        await asyncio.wait_for(task, 60)
        await cluster3.server(before.leader).start()
        await _placement_where(
            js,
            "the killed server current again",
            lambda p: p.leader and any(r.name == before.leader and r.current for r in p.followers),
        )
        ids: dict[str, int] = {}
        async for d in read_deliveries(nc, MOTOR_STREAM):
            eid = event_id(d.data)
            if eid is not None:
                ids.setdefault(eid, d.seq)
        result = audit(list(read_journal(journal)), MOTOR_STREAM, ids)
        print(f"leader {before.leader} -> {after.leader}; {failures} publishes retried; {result.acked} acked")
        assert result.acked == 400
        assert result.kept, f"acknowledged but lost: {result.missing[:5]}"
        assert not result.moved
        assert len(ids) == 400  # each event once: the retries were deduplicated
    finally:
        await nc.close()


async def test_a_minority_acknowledges_nothing_until_the_majority_is_back(cluster3: NatsCluster) -> None:
    nc = await connect(cluster3.urls, name="minority")
    try:
        js = nc.jetstream()
        await ensure_streams(js, NatsConfig(replicas=3))
        pub = Publisher(js, ack_timeout=1.0)
        await pub.publish(_event(0))
        survivor = "n1"
        down = [m.name for m in cluster3.members if m.name != survivor]
        for name in down:
            await cluster3.server(name).kill()
        with pytest.raises(StreamsError):
            for i in range(1, 4):  # one server of three: no quorum, no ack
                await pub.publish(_event(i))
        for name in down:
            await cluster3.server(name).start()
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(StreamsError):
                await pub.publish(_event(9))
                break
            assert time.monotonic() < deadline, "the cluster never took writes again"
            await asyncio.sleep(0.3)
    finally:
        await nc.close()


async def _step_down_to(nc: object, stream: str, preferred: str, within: float = 30.0) -> None:
    """Move `stream`'s leadership to server `preferred` (what an operator's step-down does)."""
    import orjson

    deadline = time.monotonic() + within
    js = nc.jetstream()  # type: ignore[attr-defined]
    while True:
        info = await js.stream_info(stream)
        if info.cluster is not None and info.cluster.leader == preferred:
            return
        assert time.monotonic() < deadline, f"{stream} never led by {preferred}"
        body = orjson.dumps({"placement": {"preferred": preferred}})
        with contextlib.suppress(Exception):
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=5)  # type: ignore[attr-defined]
        await asyncio.sleep(1.0)


async def test_the_heartbeat_stream_without_a_leader_deafens_the_controller_until_it_has_one(
    cluster3: NatsCluster,
) -> None:
    from controller.hearing import HeartbeatPath
    from streams.definitions import HB_STREAM

    nc = await connect(cluster3.urls, name="hb-path")
    try:
        await ensure_streams(nc.jetstream(), NatsConfig(replicas=3))
        await _step_down_to(nc, HB_STREAM, "n1")
        path = HeartbeatPath(JetStreamLog(nc), time.time, every=0.2, answer_within=1.0)
        assert await path.probe() and not path.down
        await cluster3.server("n1").kill()  # the heartbeat stream's leader: none until elected
        deadline = time.monotonic() + 10
        while not path.down:
            assert time.monotonic() < deadline, "the leaderless stream still answered"
            await path.probe()
        down_at = time.time()
        deadline = time.monotonic() + 30
        while not await path.probe():
            assert time.monotonic() < deadline, "no new leader of the heartbeat stream"
            await asyncio.sleep(0.2)
        assert path.back_since >= down_at and path.outages == 1
        print(f"heartbeat stream leaderless for {path.back_since - down_at:.1f} s")
    finally:
        await nc.close()
