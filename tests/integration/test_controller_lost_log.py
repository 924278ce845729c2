"""A lost log under a running cluster: the live processes make the log hold the truth again.

Before issue 11 the controller carried on from memory after a purge (and asked a recreated
stream for the old sequence numbers), so a fold of MOTOR showed no instance at all, for good.
Now the controller's LiveFold notices, it rebuilds its state from what MOTOR holds, node
agents register again with what they run, and the instances are re-adopted under their ids
with their engines untouched.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.events import InstanceState
from core.state import ClusterState
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.replay import fold_stream
from tests.integration.controller_harness import Cluster, engine_pid, state_is

WITHIN = 60.0


def summary(state: ClusterState) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Instance id -> (state, member nodes), as a fold of the log says."""
    return {
        iid: (inst.state.value, tuple(m.node_id for m in inst.spec.members))
        for iid, inst in sorted(state.instances.items())
    }


@pytest.mark.parametrize("how", ["purge", "delete-and-recreate"])
async def test_lost_log_under_a_running_cluster_holds_the_truth_again_within_60s(
    cluster: Cluster, nc: Client, js: JetStreamContext, how: str
) -> None:
    cluster.configure(union=2)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    cluster.agent("n1", "union")
    cluster.agent("n2", "union")
    ids: set[int] = set()
    for _ in range(2):
        asm = await cluster.tail.wait(
            lambda ev: ev.type == "instance.assembled" and ev.data.instance_id not in ids, within=120
        )
        ids.add(asm.data.instance_id)
    for iid in ids:
        await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    state, _ = await fold_stream(nc)
    before = summary(state)
    assert {s for s, _ in before.values()} == {"ACTIVE"} and set(before) == ids
    pids = {n: await engine_pid(a) for n, a in cluster.agents.items()}

    if how == "purge":
        await js.purge_stream(MOTOR_STREAM)
    else:
        await js.delete_stream(MOTOR_STREAM)
        await asyncio.sleep(1.0)  # away for a moment: nobody may give up on it
        await ensure_streams(js)
    lost = time.monotonic()
    state, _ = await fold_stream(nc)
    assert summary(state) == {}  # what a fold of the log showed for good before the fix

    deadline = lost + WITHIN
    while True:
        state, _ = await fold_stream(nc)
        if summary(state) == before:
            break
        assert time.monotonic() < deadline, (
            f"a fold of MOTOR shows {summary(state)}, not {before}, {WITHIN}s after the {how}\n{cluster.logs()}"
        )
        await asyncio.sleep(1.0)  # re-reading the log: nothing to await
    took = time.monotonic() - lost
    print(f"after the {how} a fold of MOTOR holds every instance again in {took:.1f}s")
    for node, agent in cluster.agents.items():
        assert await engine_pid(agent) == pids[node], f"{node}'s engine was restarted"
        assert state.nodes[node].instance_id in ids
    assert all(inst.state == InstanceState.ACTIVE for inst in state.instances.values())
    assert c1.proc is not None and c1.proc.poll() is None
    status, body = await c1.get("/readiness")
    assert status == 200, body
    _, text = await c1.get("/metrics")
    assert "motor_controller_log_lost_total 1.0" in str(text)
    assert [loss.kind for loss in cluster.tail.losses] == ["purged" if how == "purge" else "recreated"]
