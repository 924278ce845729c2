"""Controller + real node agents + builtin engines on a real nats-server: assembly and probes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.integration.controller_harness import Cluster, assembled, state_is


async def test_union_instance_assembled_started_and_active(cluster: Cluster) -> None:
    cluster.configure(union=1)
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    cluster.agent("n1", "union")
    asm = await cluster.tail.wait(assembled("union"), within=30)
    iid = asm.data.instance_id
    assert [m.node_id for m in asm.data.members] == ["n1"]
    start = await cluster.tail.wait(lambda ev: ev.type == "command.start")
    assert (
        start.data.node_id,
        start.data.instance_id,
        start.data.caused_by if False else start.caused_by.id,
    ) == (
        "n1",
        iid,
        asm.id,
    )
    await cluster.tail.wait(
        lambda ev: ev.type == "endpoint.status_changed" and ev.data.status == "READY", within=40
    )
    active = await cluster.tail.wait(state_is(iid, "ACTIVE"), within=20)
    assert active.source == "controller/c1"

    status, body = await ctl.get("/v1/instances")
    assert status == 200
    (inst,) = body["instances"]
    assert (inst["id"], inst["role"], inst["state"]) == (iid, "union", "ACTIVE")
    ep = inst["members"][0]["endpoints"][0]
    assert ep["status"] == "READY" and ep["business_port"] > 0
    assert body["controller"] == {"id": "c1", "leader": True, "leader_id": "c1", "term": 1}
    status, alarms = await ctl.get("/v1/alarms")
    assert status == 200 and alarms["faults"] == [] and alarms["precision_alarms"] == []
    status, text = await ctl.get("/metrics")
    assert status == 200 and "motor_controller_is_leader 1.0" in text
    assert 'motor_controller_decisions_total{type="command.start"} 1.0' in text
    # Heartbeats are folded, counted and their lag observed (the heartbeat bench reads these).
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        _, text = await ctl.get("/metrics")
        folded = _sample(text, 'motor_controller_events_folded_total{stream="MOTOR_HB"}')
        observed = _sample(text, "motor_controller_heartbeat_lag_seconds_count")
        if folded > 0 and observed > 0:
            break
        assert asyncio.get_running_loop().time() < deadline, (folded, observed)
        await asyncio.sleep(0.5)  # polling another process's metrics


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_prefill_decode_pair_assembled_from_their_own_roles(cluster: Cluster) -> None:
    cluster.configure(prefill=1, decode=1)
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    cluster.agent("p1", "prefill")
    cluster.agent("d1", "decode")
    p = await cluster.tail.wait(assembled("prefill"), within=30)
    d = await cluster.tail.wait(assembled("decode"), within=30)
    assert [m.node_id for m in p.data.members] == ["p1"]
    assert [m.node_id for m in d.data.members] == ["d1"]
    for iid in (p.data.instance_id, d.data.instance_id):
        await cluster.tail.wait(state_is(iid, "ACTIVE"), within=40)
    # The controller's own view follows the log: it may fold its last ACTIVE a moment after
    # the tail saw it (seen once in the full suite on a loaded machine).
    deadline = time.monotonic() + 10
    while True:
        _, body = await ctl.get("/v1/instances")
        roles: dict[str, Any] = {i["role"]: i["state"] for i in body["instances"]}
        if roles == {"prefill": "ACTIVE", "decode": "ACTIVE"} or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert roles == {"prefill": "ACTIVE", "decode": "ACTIVE"}


async def test_readiness_is_503_with_an_openai_error_on_a_standby(cluster: Cluster) -> None:
    cluster.configure(union=1)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    c2 = cluster.controller("c2")
    await c2.wait_http("/liveness")
    await cluster.tail.wait(lambda ev: ev.type == "controller.leader_changed")
    status, body = await c2.get("/readiness")
    assert status == 503
    assert (
        body["error"]["code"] in ("standby", "replaying") and body["error"]["type"] == "service_unavailable"
    )
    _, inst = await c2.get("/v1/instances")
    assert inst["controller"]["leader"] is False
