"""The fleet simulator of `just bench fleet`, small: a real controller assembles every instance.

Twenty simulated node agents (each its own NATS connection) against a real `motor controller`
process, on the bench's own config mix, so the simulator and the bench's fold of the log cannot
rot unnoticed: every instance ends ACTIVE in the log, every start was answered and acked, and
every node heartbeats its READY endpoints.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.config import config_from_dict
from core.events import CommandApplied, EndpointStatus, Heartbeat, StartCommand
from streams.definitions import HB_STREAM, MOTOR_STREAM
from streams.jetstream import JetStreamLog
from streams.livefold import LiveFold
from streams.permissions import durable_name
from streams.reader import Record, read_range
from streams.server import EmbeddedNats
from tests.bench.fleet import LogWatch, fleet_config
from tests.fleetsim import FAKE_PID_BASE, Fleet, fleet_plan
from tests.integration.controller_harness import Controller

pytestmark = pytest.mark.timeout(120)

NODES = 20


async def test_twenty_simulated_nodes_are_assembled_by_a_real_controller_until_every_instance_is_active(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    raw = fleet_config(NODES)
    cfg = config_from_dict(raw)
    plan = fleet_plan(cfg)
    instances = sum(sec.instances for sec in cfg.sections().values())
    assert len(plan) == NODES and instances == NODES  # 10 union, 5 prefill, 5 decode
    path = tmp_path / "fleet.json"
    path.write_bytes(orjson.dumps(raw))
    watch = LogWatch(NODES, instances)
    fold = LiveFold(JetStreamLog(nc), watch.apply, name="test-fleet")
    await fold.start()
    controller = Controller(tmp_path, path, nats_server.url).start()
    fleet = Fleet(cfg, plan, nats_server.url)
    try:
        await controller.wait_http("/readiness")
        await fleet.start()
        await asyncio.wait_for(watch.all_active.wait(), 60)
        records = [r async for r in read_range(nc)]
        starts = [r.event for r in records if isinstance(r.event, StartCommand)]
        applied = {r.event.data.command_id for r in records if isinstance(r.event, CommandApplied)}
        assert len(starts) == NODES and {s.data.command_id for s in starts} <= applied
        assert {s.data.node_id for s in starts} == {p.node_id for p in plan}
        ready_pids = [
            r.event.data.pid
            for r in records
            if r.event.type == "endpoint.status_changed" and r.event.data.status == EndpointStatus.READY
        ]
        assert len(ready_pids) == NODES and all(p is not None and p > FAKE_PID_BASE for p in ready_pids)
        for p in plan:  # every start acked once answered
            info = await js.consumer_info(MOTOR_STREAM, durable_name(p.node_id))
            assert info.num_ack_pending == 0 and info.delivered.consumer_seq == 1
        await _every_node_heartbeats_ready(nc, {p.node_id for p in plan})
    finally:
        await fleet.close()
        controller.cleanup()
        await fold.close()


async def _every_node_heartbeats_ready(nc: Client, nodes: set[str]) -> None:
    """The latest heartbeat of each node lists its endpoint READY (MOTOR_HB keeps one a node)."""
    for _ in range(50):
        latest: dict[str, Record] = {r.event.data.node_id: r async for r in read_range(nc, HB_STREAM)}
        ready = {
            n
            for n, r in latest.items()
            if isinstance(r.event, Heartbeat)
            and r.event.data.endpoints
            and all(e.status == EndpointStatus.READY for e in r.event.data.endpoints)
        }
        if ready >= nodes:
            return
        await asyncio.sleep(0.2)  # heartbeats come every interval
    raise AssertionError(f"nodes without a READY heartbeat: {sorted(nodes - ready)}")
