"""Coordinator replicas on one port (`motor up --coordinators N`): both listen with
SO_REUSEPORT, and a replica joins the port only once its table holds the log (a restarted one
would otherwise take connections while it replays and answer 503)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from coordinator.service import CoordinatorService
from core.coordconfig import CoordinatorConfig
from core.events import Role
from streams.definitions import MOTOR_STREAM
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.unit.coord_events import instance_events


async def stop_within(service: CoordinatorService, seconds: float) -> None:
    """Stop a replica, giving up after `seconds`: its log follower's close has been seen to
    block for ~40 s and to ignore a cancellation (streams.livefold), which is not what these
    tests are about."""
    task = asyncio.create_task(service.stop())
    _, pending = await asyncio.wait({task}, timeout=seconds)
    for t in pending:
        t.cancel()


async def test_two_replicas_share_one_port_and_join_caught_up(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    pub = Publisher(js)
    for iid in range(1, 41):  # a log worth replaying
        for ev in instance_events(iid, Role.UNION):
            await pub.publish(ev)
    last = (await js.stream_info(MOTOR_STREAM)).state.last_seq
    settings = CoordinatorConfig(host="127.0.0.1", port=1)
    first: CoordinatorService | None = CoordinatorService(
        settings, nats_server.url, port=0, name="r1", reuse_port=True
    )
    assert first is not None
    await first.start()
    port = first.port
    second = CoordinatorService(settings, nats_server.url, port=port, name="r2", reuse_port=True)
    try:
        assert first.ctx is not None and first.ctx.caught_up.is_set()
        assert first.ctx.table.last_seq == last
        await second.start()
        assert second.ctx is not None and second.ctx.caught_up.is_set()
        assert second.ctx.table.last_seq == last
        # Without SO_REUSEPORT the port is taken.
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
        seqs = set()
        async with aiohttp.ClientSession() as http:
            for _ in range(40):  # new connections: the kernel spreads them over both
                async with http.get(f"http://127.0.0.1:{port}/startup", headers={"Connection": "close"}) as r:
                    assert r.status == 200
                    seqs.add((await r.json())["log_seq"])
        assert seqs == {last}
        # Each replica answers on the shared port: stop one, the other still does.
        await first.stop()
        first = None
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/liveness") as r:
            assert r.status == 200
    finally:
        for service in (second, first):
            if service is not None:
                await stop_within(service, 20)


async def test_a_starting_replica_keeps_the_lease_ttl_and_stream_settings_it_found(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    """Regression: every coordinator start reset the leader bucket to the default 6 s TTL, so a
    supervisor restarting a replica lengthened the controllers' failover."""
    from streams.definitions import LEADER_BUCKET, ensure_streams, kv_stream

    await ensure_streams(js, lease_ttl=2.0)  # what `motor up` does with controller.lease_ttl 2
    before = (await js.stream_info(kv_stream(LEADER_BUCKET))).config.max_age
    service = CoordinatorService(CoordinatorConfig(host="127.0.0.1"), nats_server.url, port=0, name="r3")
    await service.start()
    try:
        after = (await js.stream_info(kv_stream(LEADER_BUCKET))).config.max_age
        assert before == after == 2.0
    finally:
        await stop_within(service, 20)
