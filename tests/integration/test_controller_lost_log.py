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
from streams.offline import fold_stream
from streams.publisher import Publisher
from tests.integration.controller_harness import Cluster, assembled, engine_pid, state_is
from tests.integration.nodeagent_harness import stop_command

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


async def test_a_controller_started_after_a_purge_announces_past_the_term_its_nodes_obeyed(
    cluster: Cluster, nc: Client, js: JetStreamContext
) -> None:
    """A controller that never folded the reigns a purge took names its reign from the log alone
    (term 1); the node agents obeyed a later one and refuse its commands `stale_term`. Those
    refusals are no failed starts: the leader announces a reign past the nodes' term and sends
    the same starts again, and nothing is failed over."""
    cluster.configure(union=1)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    agent = cluster.agent("n1", "union")
    asm = await cluster.tail.wait(assembled("union"), within=120)
    iid = asm.data.instance_id
    await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    pid = await engine_pid(agent)
    # A leader of term 5 (one whose reign the purge will take) stopped an instance this node
    # does not run: nothing stops, and the agent keeps term 5 as the newest it obeyed.
    t5 = stop_command("n1", instance_id=999)
    t5 = t5.model_copy(update={"data": t5.data.model_copy(update={"term": 5})})
    await Publisher(js).publish(t5)
    await cluster.tail.wait(
        lambda ev: ev.type == "command.applied" and ev.data.command_id == t5.data.command_id
    )

    c1.kill9()
    await js.purge_stream(MOTOR_STREAM)
    mark = cluster.tail.index()
    c2 = cluster.controller("c2")
    refused = await cluster.tail.wait(
        lambda ev: ev.type == "command.refused" and ev.data.verb == "start", within=60, after=mark
    )
    assert (refused.data.code, refused.data.seen_term) == ("stale_term", 5), refused.data
    reign = await cluster.tail.wait(
        lambda ev: ev.type == "controller.leader_changed" and ev.data.term > 5, within=30, after=mark
    )
    assert reign.data.leader_id == "c2"
    again = await cluster.tail.wait(
        lambda ev: ev.type == "command.start" and ev.data.term == reign.data.term, within=30, after=mark
    )
    assert again.data.attempt == 1, "a refusal for an older term counted as a failed start"
    await cluster.tail.wait(
        lambda ev: ev.type == "command.applied" and ev.data.command_id == again.data.command_id, after=mark
    )
    await cluster.tail.wait(state_is(iid, "ACTIVE"), within=60, after=mark)
    await asyncio.sleep(3.0)  # long enough for a wrongly counted retry to be exhausted
    after = cluster.tail.events(lambda ev: True, after=mark)
    assert not [ev for ev in after if ev.type == "fault.reported"], [ev.data for ev in after]
    assert not [ev for ev in after if ev.type == "instance.state_changed" and ev.data.state == "TERMINATED"]
    state, _ = await fold_stream(nc)
    assert summary(state) == {iid: ("ACTIVE", ("n1",))}, f"{summary(state)}\n{cluster.logs()}"
    assert await engine_pid(agent) == pid, "the engine was restarted"
    _, text = await c2.get("/metrics")
    assert "motor_controller_leader_changes_total 2.0" in str(text), text
