"""A log older than its `max_age` still knows every instance (issue 24 item 3).

Before the fix nothing said `instance.assembled` (or a node's registration and READY) again for
an instance that simply lived long, so once MOTOR aged them out a fold of the log alone (a
coordinator started then, `motor status`, `motor replay`) saw no instance: a restarted
coordinator answered 503 while every engine ran. Here MOTOR keeps events for a minute; the
controller restates its instances and the node agent its registration and endpoint statuses
at half of it, and after everything from the cluster's start has aged out a fresh fold sees the
instance ACTIVE and a freshly started coordinator routes to it, and a controller started then
(from its checkpoint) sends no start again: nothing restarted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext

from core.config import NatsConfig
from core.events import EndpointStatus, InstanceState
from streams.definitions import DAY, MOTOR_STREAM, ensure_streams
from streams.offline import fold_stream
from tests.integration.controller_harness import Cluster, assembled, engine_pid, state_is
from tests.integration.coord_harness import start_coordinator, wait_routable

MAX_AGE = 60.0  # seconds


async def test_after_max_age_a_fresh_fold_and_a_fresh_coordinator_see_every_instance(
    cluster: Cluster, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    nats = {"max_age_days": MAX_AGE / DAY}
    await ensure_streams(js, NatsConfig(**nats))
    assert (await js.stream_info(MOTOR_STREAM)).config.max_age == MAX_AGE
    cluster.configure(union=1, nats=nats)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    agent = cluster.agent("n1", "union")
    asm = await cluster.tail.wait(assembled("union"), within=120)
    iid = asm.data.instance_id
    await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    pid = await engine_pid(agent)
    up_to = (await js.stream_info(MOTOR_STREAM)).state.last_seq

    started = time.monotonic()
    deadline = started + 3 * MAX_AGE
    while (info := await js.stream_info(MOTOR_STREAM)).state.first_seq <= up_to:
        assert time.monotonic() < deadline, f"nothing aged out of {info.state}\n{cluster.logs()}"
        await asyncio.sleep(1.0)  # age-out runs on the server's timer: nothing to await
    print(f"the cluster's first {up_to} events aged out after {time.monotonic() - started:.0f}s")

    state, _ = await fold_stream(nc)  # what a fresh coordinator, `motor status` or replay fold
    inst = state.instances.get(iid)
    assert inst is not None, f"a fold of the aged log has no instance {iid}: {dict(state.instances)}"
    assert inst.state == InstanceState.ACTIVE
    assert inst.spec == asm.data
    node = state.nodes["n1"]
    assert node.instance_id == iid
    assert set(node.endpoint_status.values()) == {EndpointStatus.READY}

    coord = await start_coordinator(tmp_path, cluster.nats_url)
    try:
        await wait_routable(coord, within=30)
    finally:
        coord.stop()

    # A controller started now folds its checkpoint and what MOTOR still holds: it knows the
    # start that aged out (a fold of the log alone would send it again).
    c1.kill9()
    c2 = cluster.controller("c2")
    await c2.wait_http("/readiness", within=60)
    await cluster.tail.wait(
        lambda ev: ev.type == "controller.leader_changed" and ev.source == "controller/c2"
    )
    await asyncio.sleep(3.0)  # a few of its decide ticks: a start it would send comes in the first

    # Restating moved nothing: one start, the same engine, never out of ACTIVE.
    assert await engine_pid(agent) == pid
    starts = cluster.tail.events(lambda ev: ev.type == "command.start")
    assert len(starts) == 1, [ev.data for ev in starts]
    moves = cluster.tail.events(lambda ev: ev.type == "instance.state_changed")
    assert [ev.data.state for ev in moves] == [InstanceState.ACTIVE], [ev.data for ev in moves]
    restated = cluster.tail.events(lambda ev: ev.type == "instance.restated")
    regs = cluster.tail.events(lambda ev: ev.type == "node.registered" and ev.data.restated)
    assert restated and regs
