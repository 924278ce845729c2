"""Node agent: fault reporter and container-snapshot observation, with real builtin engines."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from nats.js import JetStreamContext

from core import subjects
from core.codec import decode
from core.events import (
    EndpointStatus,
    EndpointStatusChanged,
    FaultCleared,
    FaultLevel,
    FaultReported,
    Heartbeat,
    NodeRegistered,
    SnapshotCheckpoint,
    SnapshotPhase,
)
from core.ids import new_id
from streams.definitions import HB_STREAM
from streams.publisher import Publisher
from tests.integration.nodeagent_harness import Agent, EventTail, start_command, write_config

pytestmark = pytest.mark.timeout(240)


def about(cls: type, node: str):  # type: ignore[no-untyped-def]
    return lambda ev: isinstance(ev, cls) and ev.data.node_id == node


async def set_faults(port: int, body: dict[str, object]) -> None:
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/admin/faults", json=body) as r:
        assert r.status == 200, await r.text()


async def test_fault_reporter_reports_and_clears(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = f"n-{new_id()[-10:]}"
    cfg = write_config(tmp_path / "cluster.json", fault_reporter=True)
    agent = Agent(
        tmp_path,
        cfg,
        node,
        nats_server.url,
        extra=["--fault-poll-interval", "0.2"],  # type: ignore[attr-defined]
    ).start()
    agents.append(agent)
    reg = await tail.wait(about(NodeRegistered, node))
    await Publisher(js).publish(start_command(node, reg.data.endpoints))
    await tail.wait(
        lambda ev: about(EndpointStatusChanged, node)(ev) and ev.data.status == EndpointStatus.READY
    )

    await set_faults(agent.engine_port, {"ft_status": "unhealthy"})
    fault = await tail.wait(about(FaultReported, node))
    assert fault.data.code == "engine_unhealthy" and fault.data.level == FaultLevel.L3
    assert fault.data.instance_id == 7 and fault.data.endpoint_id == 0 and fault.data.kind == "software"

    await set_faults(agent.engine_port, {"ft_status": "dead"})
    cleared = await tail.wait(about(FaultCleared, node))
    assert cleared.data.fault_id == fault.data.fault_id
    dead = await tail.wait(lambda ev: about(FaultReported, node)(ev) and ev.data.code == "engine_dead")
    assert dead.data.level == FaultLevel.L5

    await set_faults(agent.engine_port, {"ft_status": "healthy"})
    cleared = await tail.wait(
        lambda ev: about(FaultCleared, node)(ev) and ev.data.fault_id == dead.data.fault_id
    )


async def test_snapshot_phases_and_pending_heartbeats(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = f"n-{new_id()[-10:]}"
    snap_dir = tmp_path / "snapshot"
    cfg = write_config(
        tmp_path / "cluster.json",
        {"snapshot": {"enabled": True, "metadata_dir": str(snap_dir), "model_save_path": "/save"}},
    )
    agent = Agent(tmp_path, cfg, node, nats_server.url).start()  # type: ignore[attr-defined]
    agents.append(agent)
    reg = await tail.wait(about(NodeRegistered, node))
    await Publisher(js).publish(start_command(node, reg.data.endpoints))

    prepared = await tail.wait(about(SnapshotCheckpoint, node))
    assert prepared.data.phase == SnapshotPhase.METADATA_PREPARED
    meta = orjson.loads((snap_dir / "snapshot_metadata.json").read_bytes())
    assert meta["model_save_path"] == "/save" and meta["job_name"] == "motor"
    assert meta["data_parallel_master_ip"] == "127.0.0.1"

    suspended = await tail.wait(
        lambda ev: about(SnapshotCheckpoint, node)(ev) and ev.data.phase == SnapshotPhase.SUSPENDED
    )
    assert suspended.data.instance_id == 7
    assert (await agent.get("/readiness"))[0] == 200  # steady point: the host may checkpoint
    deadline = time.monotonic() + 10
    while True:
        hb = decode((await js.get_last_msg(HB_STREAM, subjects.heartbeat(node))).data)
        assert isinstance(hb, Heartbeat)
        if hb.data.snapshot_pending:
            break
        assert time.monotonic() < deadline, "heartbeats never flagged snapshot_pending"
        await asyncio.sleep(0.1)

    (snap_dir / "checkpoint").touch()  # the host side finished its checkpoint
    await tail.wait(
        lambda ev: about(SnapshotCheckpoint, node)(ev) and ev.data.phase == SnapshotPhase.CHECKPOINT_DONE
    )
    await tail.wait(
        lambda ev: about(SnapshotCheckpoint, node)(ev) and ev.data.phase == SnapshotPhase.RESTORED
    )
    deadline = time.monotonic() + 10
    while True:
        hb = decode((await js.get_last_msg(HB_STREAM, subjects.heartbeat(node))).data)
        assert isinstance(hb, Heartbeat)
        if not hb.data.snapshot_pending:
            break
        assert time.monotonic() < deadline, "snapshot_pending never cleared"
        await asyncio.sleep(0.1)
