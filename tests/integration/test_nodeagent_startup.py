"""A node agent whose start-up NATS cannot answer yet waits and registers once it can.

The fault is a full MOTOR: no room for the agent's command consumer (nats-server 2.15 capped a
stream that set no limit at 1000 consumers, so about the 1000th node of a fleet met it). Before,
the agent exited at once and only a supervisor brought it back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from core.events import NodeRegistered
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.server import EmbeddedNats
from tests.integration.nodeagent_harness import Agent, EventTail, write_config

pytestmark = pytest.mark.timeout(120)

WAITING = "cannot bind the command consumer yet"


async def _fill_motor(js: JetStreamContext) -> None:
    info = await js.stream_info(MOTOR_STREAM)  # the test's own tail has a consumer on it
    await js.update_stream(dataclasses.replace(info.config, max_consumers=info.state.consumer_count + 1))
    await js.add_consumer(MOTOR_STREAM, ConsumerConfig(durable_name="taken"))


async def _until_logged(agent: Agent, text: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while text not in agent.output():
        assert agent.proc is not None and agent.proc.poll() is None, (
            f"agent exited:\n{agent.output()[-2000:]}"
        )
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{agent.output()[-2000:]}"
        await asyncio.sleep(0.1)  # another process's log


async def test_an_agent_that_cannot_bind_its_command_consumer_yet_waits_then_registers(
    nats_server: EmbeddedNats, js: JetStreamContext, tail: EventTail, agents: list[Agent], tmp_path: Path
) -> None:
    await _fill_motor(js)
    agent = Agent(tmp_path, write_config(tmp_path / "cfg.json"), "n1", nats_server.url).start()
    agents.append(agent)
    await _until_logged(agent, WAITING)
    await asyncio.sleep(1.0)  # a few tries more: still up, still unregistered
    assert agent.proc is not None and agent.proc.poll() is None
    assert not tail.events(lambda e: isinstance(e, NodeRegistered))
    await ensure_streams(js)  # as a controller starting does: MOTOR's own limit again
    await tail.wait(lambda e: isinstance(e, NodeRegistered) and e.data.node_id == "n1", within=30)
    assert agent.proc.poll() is None


async def test_a_stop_while_start_up_waits_on_nats_ends_the_agent(
    nats_server: EmbeddedNats, js: JetStreamContext, agents: list[Agent], tmp_path: Path
) -> None:
    await _fill_motor(js)
    agent = Agent(tmp_path, write_config(tmp_path / "cfg.json"), "n1", nats_server.url).start()
    agents.append(agent)
    await _until_logged(agent, WAITING)
    assert agent.terminate(timeout=15) == 0
    assert "stopped during start-up" in agent.output()
