"""The node agent against a real nats-server and real builtin engines, as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from core import subjects
from core.codec import decode
from core.events import (
    CommandApplied,
    CommandRefused,
    EndpointStatus,
    EndpointStatusChanged,
    Heartbeat,
    NodeDeregistered,
    NodeRegistered,
)
from core.ids import new_id
from nodeagent.commands import durable_name
from streams.definitions import HB_STREAM, MOTOR_STREAM
from streams.publisher import Publisher
from tests.integration.nodeagent_harness import (
    Agent,
    EventTail,
    assembled,
    pid_alive,
    start_command,
    stop_command,
    write_config,
)

pytestmark = pytest.mark.timeout(240)


def node_id() -> str:
    return f"n-{new_id()[-10:]}"


def is_(cls: type, node: str, **want: object):  # type: ignore[no-untyped-def]
    """Predicate: an event of `cls` about `node` whose data fields equal `want`."""

    def pred(ev: object) -> bool:
        if not isinstance(ev, cls):
            return False
        data = ev.data  # type: ignore[attr-defined]
        return data.node_id == node and all(getattr(data, k) == v for k, v in want.items())

    return pred


async def acked_through(js: JetStreamContext, node: str, seq: int, within: float = 20.0) -> None:
    """Wait until the node's command consumer has acked everything up to stream seq `seq`."""
    deadline = time.monotonic() + within
    while True:
        info = await js.consumer_info(MOTOR_STREAM, durable_name(node))
        if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"command at seq {seq} not acked: {info}"
        await asyncio.sleep(0.05)


async def last_heartbeat(js: JetStreamContext, node: str) -> Heartbeat:
    msg = await js.get_last_msg(HB_STREAM, subjects.heartbeat(node))
    ev = decode(msg.data)
    assert isinstance(ev, Heartbeat)
    return ev


async def test_register_start_ready_kill_dead_stop(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = node_id()
    cfg = write_config(tmp_path / "cluster.json")
    agent = Agent(tmp_path, cfg, node, nats_server.url).start()  # type: ignore[attr-defined]
    agents.append(agent)
    pub = Publisher(js)

    reg = await tail.wait(is_(NodeRegistered, node))
    d = reg.data
    assert d.job_name == "motor" and d.pod_ip == "127.0.0.1" and d.engine_type == "builtin"
    assert [(e.id, e.business_port) for e in d.endpoints] == [(0, agent.engine_port)]
    assert d.capabilities == ("handoff", "bootstrap")
    assert d.capacity.total_blocks == 512
    assert d.agent_url == agent.url and d.instance_id is None and d.running_endpoints == ()

    # Assemble and start, as the controller would (no re-registration for an unknown instance).
    await pub.publish(assembled(node, d.endpoints))
    mark = tail.index()
    start = start_command(node, d.endpoints)
    await pub.publish(start)
    applied = await tail.wait(is_(CommandApplied, node, command_id=start.data.command_id), after=mark)
    assert applied.data.verb == "start" and applied.data.instance_id == 7
    starting = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.STARTING), after=mark)
    assert starting.data.instance_id == 7 and starting.data.previous is None
    ready = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), after=mark)
    assert ready.data.previous == EndpointStatus.STARTING

    status = await agent.status()
    assert status["status"] is True and status["instance_id"] == 7
    pid = status["endpoints"][0]["pid"]
    assert pid_alive(pid)
    assert ready.data.pid == pid  # the incarnation: the coordinator resets circuits on a new one
    assert (await agent.get("/readiness"))[0] == 200
    assert (await agent.get("/liveness"))[0] == 200
    code, metrics = await agent.get("/metrics")
    assert code == 200 and "motor_nodeagent_commands_total" in metrics
    assert Path(status["endpoints"][0]["log_file"]).name == f"engine-{node}-ep0.log"

    # Heartbeats carry the status and the load read from the engine's /metrics.
    deadline = time.monotonic() + 10
    while True:
        hb = await last_heartbeat(js, node)
        loads = hb.data.endpoints
        if loads and loads[0].status == EndpointStatus.READY and loads[0].avail_blocks > 0:
            break
        assert time.monotonic() < deadline, f"no READY heartbeat with load: {hb}"
        await asyncio.sleep(0.1)
    assert hb.data.instance_id == 7 and loads[0].avail_blocks == 512 and loads[0].avail_slots == 256

    # The same command delivered again (new envelope, same command id) does nothing twice but
    # says again what its endpoints are: it may have been sent again because the log lost what
    # followed it, and its sender waits for a READY newer than it (the simulator's seeds 353
    # and 389). A new start for the running instance is a no-op, applied, and its endpoints
    # are reported READY again after it too.
    mark = tail.index()
    again = start.model_copy(update={"id": new_id()})
    seq = await pub.publish(again)
    await acked_through(js, node, seq)
    said = await tail.wait(is_(EndpointStatusChanged, node), after=mark)
    assert (said.data.status, said.data.previous, said.data.pid) == (
        EndpointStatus.READY,
        EndpointStatus.READY,
        pid,
    )
    assert "answered again" in said.data.reason
    mark = tail.index()
    other = start_command(node, d.endpoints)
    await pub.publish(other)
    await tail.wait(is_(CommandApplied, node, command_id=other.data.command_id), after=mark)
    again_ready = await tail.wait(is_(EndpointStatusChanged, node), after=mark)
    assert (again_ready.data.status, again_ready.data.previous) == (
        EndpointStatus.READY,
        EndpointStatus.READY,
    )
    assert other.data.command_id in again_ready.data.reason
    assert pid_alive(pid) and (await agent.status())["endpoints"][0]["pid"] == pid
    assert tail.events(is_(CommandApplied, node, command_id=start.data.command_id), after=mark) == []
    assert (await agent.status())["endpoints"][0]["pid"] == pid

    # kill -9 the engine: DEAD with the exit code, within a second.
    mark = tail.index()
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    dead = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.DEAD), after=mark, within=5)
    assert time.monotonic() - killed < 1.0
    assert dead.data.exit_code == -signal.SIGKILL and "SIGKILL" in dead.data.reason
    assert (await agent.get("/readiness"))[0] == 503

    # The controller restarts it with a new start command.
    mark = tail.index()
    restart = start_command(node, d.endpoints)
    await pub.publish(restart)
    await tail.wait(is_(CommandApplied, node, command_id=restart.data.command_id), after=mark)
    back = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.STARTING), after=mark)
    assert back.data.previous == EndpointStatus.DEAD
    ready2 = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), after=mark)
    pid2 = (await agent.status())["endpoints"][0]["pid"]
    assert pid2 != pid and ready2.data.pid == pid2

    # Stop: STOPPED, applied, the engine process gone.
    mark = tail.index()
    stop = stop_command(node)
    await pub.publish(stop)
    stopped = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.STOPPED), after=mark)
    assert stopped.data.previous == EndpointStatus.READY and stopped.data.reason == "test stop"
    await tail.wait(is_(CommandApplied, node, command_id=stop.data.command_id), after=mark)
    assert not pid_alive(pid2)
    assert (await agent.status())["endpoints"] == []

    # A graceful exit deregisters.
    mark = tail.index()
    assert agent.terminate() == 0, agent.output()
    await tail.wait(is_(NodeDeregistered, node), after=mark)


async def test_refusals_job_mismatch_bad_endpoint_port_in_use(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = node_id()
    cfg = write_config(tmp_path / "cluster.json")
    agent = Agent(tmp_path, cfg, node, nats_server.url, job_name="job-a").start()  # type: ignore[attr-defined]
    agents.append(agent)
    pub = Publisher(js)
    reg = await tail.wait(is_(NodeRegistered, node))
    eps = reg.data.endpoints

    wrong_job = start_command(node, eps, job_name="job-b")
    await pub.publish(wrong_job)
    refused = await tail.wait(is_(CommandRefused, node, command_id=wrong_job.data.command_id))
    assert refused.data.code == "job_mismatch"
    assert "'job-b'" in refused.data.reason and "'job-a'" in refused.data.reason

    bad = start_command(node, (eps[0].model_copy(update={"id": 5}),), job_name="job-a")
    await pub.publish(bad)
    refused = await tail.wait(is_(CommandRefused, node, command_id=bad.data.command_id))
    assert refused.data.code == "bad_endpoint" and "endpoint 5" in refused.data.reason

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", agent.engine_port))
        squatter.listen()
        busy = start_command(node, eps, job_name="job-a")
        await pub.publish(busy)
        refused = await tail.wait(is_(CommandRefused, node, command_id=busy.data.command_id))
    assert refused.data.code == "port_in_use" and str(agent.engine_port) in refused.data.reason
    assert (await agent.status())["endpoints"] == []
    assert tail.events(is_(EndpointStatusChanged, node)) == []


async def test_restart_adopts_running_engines_and_resyncs(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = node_id()
    cfg = write_config(tmp_path / "cluster.json")
    first = Agent(tmp_path, cfg, node, nats_server.url).start()  # type: ignore[attr-defined]
    agents.append(first)
    pub = Publisher(js)
    reg = await tail.wait(is_(NodeRegistered, node))
    await pub.publish(assembled(node, reg.data.endpoints, instance_id=9))
    await pub.publish(start_command(node, reg.data.endpoints, instance_id=9))
    await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY))
    pid = (await first.status())["endpoints"][0]["pid"]

    # The agent crashes; its engine keeps running. A new agent re-reports the truth.
    first.kill9()
    assert pid_alive(pid)
    mark = tail.index()
    second = Agent(
        tmp_path, cfg, node, nats_server.url,  # type: ignore[attr-defined]
        port=first.port, engine_port=first.engine_port, marker=first.marker,
    ).start()  # fmt: skip
    agents.append(second)
    again = await tail.wait(is_(NodeRegistered, node), after=mark)
    assert again.data.instance_id == 9 and again.data.running_endpoints == (0,)
    # READY comes after the registration (which resets the fold to STARTING), never before.
    await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), after=tail.last_index)
    assert [e.data.status for e in tail.events(is_(EndpointStatusChanged, node), after=mark)] == [
        EndpointStatus.READY
    ]
    status = await second.status()
    assert status["instance_id"] == 9 and status["endpoints"][0]["pid"] == pid

    # The log forgets the node (a lost tail is the same to the agent): it registers again,
    # with the engines it runs.
    mark = tail.index()
    await js.purge_stream(MOTOR_STREAM)
    resent = await tail.wait(is_(NodeRegistered, node), after=mark, within=15)
    assert resent.data.instance_id == 9 and resent.data.running_endpoints == (0,)
    # The registration resets the fold's view of its endpoints: READY is said again after it.
    reasserted = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.READY), after=mark)
    assert "re-asserted" in reasserted.data.reason and reasserted.data.pid == pid  # same incarnation

    # An adopted engine's exit is seen at once too (pidfd), exit code unknown.
    mark = tail.index()
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    dead = await tail.wait(is_(EndpointStatusChanged, node, status=EndpointStatus.DEAD), after=mark, within=5)
    assert time.monotonic() - killed < 1.0
    assert dead.data.exit_code is None and "adopted" in dead.data.reason


async def test_unknown_connector_fails_at_startup(
    tmp_path: Path, nats_server: object, agents: list[Agent]
) -> None:
    cfg = write_config(
        tmp_path / "cluster.json",
        {"engine_type": "vllm", "engine_config": {"kv_transfer_config": {"kv_connector": "FancyConnector"}}},
        role="prefill",
    )
    agent = Agent(tmp_path, cfg, node_id(), nats_server.url, role="prefill").start()  # type: ignore[attr-defined]
    agents.append(agent)
    assert agent.proc is not None
    assert agent.proc.wait(60) == 2
    out = agent.output()
    assert "FancyConnector" in out and "dispatch_profile" in out and "Traceback" not in out
