"""Commands that cannot be carried out never block a node: a real agent, a real nats-server.

A poison command (its handler raises every time) is delivered `command_attempts` times, then
refused with `handler_failed` and terminated; an undecodable message on the node's command
subject is terminated and counted; the node's next command runs in each case. The durable
command consumer comes back when MOTOR is deleted and made again under a running agent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import orjson
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.events import (
    CommandApplied,
    CommandRefused,
    EndpointStatus,
    EndpointStatusChanged,
    NodeRegistered,
    StartCommand,
    StopCommand,
)
from core.ids import new_id
from nodeagent.commands import durable_name
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.publisher import Publisher
from tests import placed
from tests.integration.nodeagent_harness import (
    Agent,
    EventTail,
    start_command,
    stop_command,
    write_config,
)

pytestmark = pytest.mark.timeout(240)


def node_id() -> str:
    return f"n-{new_id()[-10:]}"


def is_(cls: type, node: str, **want: object):  # type: ignore[no-untyped-def]
    def pred(ev: object) -> bool:
        if not isinstance(ev, cls):
            return False
        data = ev.data  # type: ignore[attr-defined]
        return data.node_id == node and all(getattr(data, k) == v for k, v in want.items())

    return pred


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the agent's /metrics (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def acked_through(js: JetStreamContext, node: str, seq: int, within: float = 30.0) -> None:
    """Wait until the node's command consumer has acked (or terminated) up to stream seq `seq`."""
    deadline = time.monotonic() + within
    while True:
        info = await js.consumer_info(MOTOR_STREAM, durable_name(node))
        if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"command at seq {seq} not acked: {info}"
        await asyncio.sleep(0.05)  # consumer state has no event to await


async def up(
    tmp_path: Path, url: str, tail: EventTail, agents: list[Agent], endpoints: int = 1
) -> tuple[Agent, NodeRegistered]:
    node = node_id()
    engine = {"fast": True, "num_blocks": 512} | (
        {"data_parallel_size_local": endpoints} if endpoints > 1 else {}
    )
    cfg = write_config(
        tmp_path / "cluster.json", {"engine_config": engine}, command_attempts=3, command_retry_delay=0.2
    )
    agent = Agent(tmp_path, cfg, node, url).start()
    agents.append(agent)
    reg = await tail.wait(is_(NodeRegistered, node), within=60)
    return agent, reg


async def test_poison_command_is_refused_after_its_attempts_and_the_next_start_runs(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    # Two endpoints: the poison starts the second, whose engine log cannot be opened (a
    # directory is in its way), so its handler raises every time. (It used to be a bootstrap
    # port of 70000, an OverflowError to bind; such a command no longer decodes: issue 24.)
    agent, reg = await up(tmp_path, nats_server.url, tail, agents, endpoints=2)  # type: ignore[attr-defined]
    node = agent.node_id
    pub = Publisher(js)
    first, second = reg.data.endpoints
    (tmp_path / "logs" / f"engine-{node}-ep{second.id}.log").mkdir(parents=True)
    poison = start_command(node, (second,), instance_id=3)
    good = start_command(node, (first,), instance_id=4)
    await pub.publish(poison)
    await pub.publish(good)

    refused = await tail.wait(is_(CommandRefused, node, command_id=poison.data.command_id), within=30)
    assert refused.data.code == "handler_failed", refused.data
    assert "3 times" in refused.data.reason and "IsADirectoryError" in refused.data.reason
    await tail.wait(is_(CommandApplied, node, command_id=good.data.command_id), within=30)
    await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), within=60)
    assert (await agent.status())["instance_id"] == 4

    _, text = await agent.get("/metrics")
    assert metric(text, "motor_nodeagent_commands_rejected_total", reason="handler_failed") == 1
    assert metric(text, "motor_nodeagent_command_failures_total") == 3

    # A copy of the poison (same command id) is answered from memory: never run again.
    again = await pub.publish(poison.model_copy(update={"id": new_id()}))
    await acked_through(js, node, again)
    assert metric((await agent.get("/metrics"))[1], "motor_nodeagent_command_failures_total") == 3


async def test_undecodable_and_misaddressed_commands_are_dropped_and_the_next_runs(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    agent, reg = await up(tmp_path, nats_server.url, tail, agents)  # type: ignore[attr-defined]
    node = agent.node_id
    await js.publish(placed.command(node, "start"), b'{"type": "command.start", "data": {')
    await js.publish(placed.command(node, "start"), b"\xff\xfe not json at all")
    # Issue 24: a term no 64-bit encoder writes. It decoded; the agent kept it as the newest
    # term (its run state could no longer be saved) and refused every later command stale.
    huge = orjson.loads(stop_command(node).model_copy(update={"id": new_id()}).model_dump_json())
    huge["data"]["term"] = 2**64
    await js.publish(placed.command(node, "stop"), json.dumps(huge).encode())
    # A stop addressed to another node, on this node's subject.
    stray = stop_command("someone-else").model_copy(update={"id": new_id()})
    await js.publish(placed.command(node, "stop"), stray.model_dump_json().encode())
    good = start_command(node, reg.data.endpoints)
    await Publisher(js).publish(good)

    refused = await tail.wait(
        lambda ev: ev.type == "command.refused" and ev.data.command_id == stray.data.command_id
    )
    assert refused.data.code == "wrong_node"
    await tail.wait(is_(CommandApplied, node, command_id=good.data.command_id), within=30)
    _, text = await agent.get("/metrics")
    assert metric(text, "motor_nodeagent_commands_rejected_total", reason="undecodable") == 3
    assert "undecodable command at seq" in agent.output()
    assert agent.proc is not None and agent.proc.poll() is None


async def test_command_consumer_is_made_again_after_motor_is_deleted_and_recreated(
    tmp_path: Path,
    nats_server: object,
    nc: Client,
    js: JetStreamContext,
    tail: EventTail,
    agents: list[Agent],
) -> None:
    agent, reg = await up(tmp_path, nats_server.url, tail, agents)  # type: ignore[attr-defined]
    node = agent.node_id
    await js.delete_stream(MOTOR_STREAM)
    await ensure_streams(js)
    after = await EventTail(nc).start()
    try:
        # Published before the agent noticed: the consumer made again still gets it.
        start = start_command(node, reg.data.endpoints)
        seq = await Publisher(js).publish(start)
        await after.wait(is_(CommandApplied, node, command_id=start.data.command_id), within=30)
        await after.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), within=60)
    finally:
        await after.close()
    await acked_through(js, node, seq)
    _, text = await agent.get("/metrics")
    assert metric(text, "motor_nodeagent_command_consumer_remade_total") == 1


def termed(cmd: StartCommand | StopCommand, term: int) -> StartCommand | StopCommand:
    """The command as a leader of `term` sends it."""
    return cmd.model_copy(update={"data": cmd.data.model_copy(update={"term": term})})


async def test_a_command_of_an_older_leader_term_is_refused_and_later_commands_run(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    """A deposed leader's late command never undoes its successor's, also after a restart."""
    agent, reg = await up(tmp_path, nats_server.url, tail, agents)  # type: ignore[attr-defined]
    node, eps = agent.node_id, reg.data.endpoints
    pub = Publisher(js)
    t2 = termed(start_command(node, eps, instance_id=2), 2)
    await pub.publish(t2)
    await tail.wait(is_(CommandApplied, node, command_id=t2.data.command_id), within=30)
    await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), within=60)

    # Term 1 (the old leader) after term 2: refused, before any other check (not `busy`).
    t1 = termed(start_command(node, eps, instance_id=1), 1)
    await pub.publish(t1)
    refused = await tail.wait(is_(CommandRefused, node, command_id=t1.data.command_id), within=30)
    assert refused.data.code == "stale_term" and "term 1" in refused.data.reason, refused.data
    assert refused.data.seen_term == 2  # what a leader must announce past to be obeyed
    assert (await agent.status())["instance_id"] == 2

    # Term 3 goes through: stop instance 2, start instance 3.
    mark = tail.index()
    stop3 = termed(stop_command(node, instance_id=2), 3)
    start3 = termed(start_command(node, eps, instance_id=3), 3)
    await pub.publish(stop3)
    await pub.publish(start3)
    await tail.wait(is_(CommandApplied, node, command_id=stop3.data.command_id), within=30, after=mark)
    await tail.wait(is_(CommandApplied, node, command_id=start3.data.command_id), within=30, after=mark)
    await tail.wait(
        is_(EndpointStatusChanged, node, status=EndpointStatus.READY), within=60, after=tail.last_index
    )
    assert (await agent.status())["instance_id"] == 3
    _, text = await agent.get("/metrics")
    assert metric(text, "motor_nodeagent_commands_rejected_total", reason="stale_term") == 1
    assert "at seq" in agent.output() and "stale_term" in agent.output()

    # The newest term is kept with the run state: a restarted agent still refuses term 2.
    agent.kill9()
    mark = tail.index()
    again = Agent(
        tmp_path, agent.config, node, nats_server.url,  # type: ignore[attr-defined]
        port=agent.port, engine_port=agent.engine_port, marker=agent.marker,
    ).start()  # fmt: skip
    agents.append(again)
    await tail.wait(is_(NodeRegistered, node), after=mark, within=60)
    late = termed(stop_command(node, instance_id=3), 2)
    await pub.publish(late)
    refused = await tail.wait(is_(CommandRefused, node, command_id=late.data.command_id), within=30)
    assert refused.data.code == "stale_term"
    assert (await again.status())["instance_id"] == 3
