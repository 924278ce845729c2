"""Node agent supervision details: one pinned engine per DP rank, and a hung /health."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
from nats.js import JetStreamContext

from core.events import EndpointStatus, EndpointStatusChanged, NodeRegistered
from core.ids import new_id
from streams.publisher import Publisher
from tests.integration.nodeagent_harness import Agent, EventTail, start_command, stop_command, write_config

pytestmark = pytest.mark.timeout(240)


def status_of(node: str, status: EndpointStatus, endpoint: int | None = None):  # type: ignore[no-untyped-def]
    def pred(ev: object) -> bool:
        return (
            isinstance(ev, EndpointStatusChanged)
            and ev.data.node_id == node
            and ev.data.status == status
            and (endpoint is None or ev.data.endpoint_id == endpoint)
        )

    return pred


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def test_one_pinned_engine_group_per_dp_rank(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = f"n-{new_id()[-10:]}"
    cfg = write_config(tmp_path / "cluster.json", {"engine_config": {"fast": True, "data_parallel_size": 2}})
    agent = Agent(
        tmp_path, cfg, node, nats_server.url,  # type: ignore[attr-defined]
        extra=["--devices", "4,5,6,7", "--device-env", "ASCEND_RT_VISIBLE_DEVICES"],
    ).start()  # fmt: skip
    agents.append(agent)
    reg = await tail.wait(lambda ev: isinstance(ev, NodeRegistered) and ev.data.node_id == node)
    assert [(e.id, e.business_port) for e in reg.data.endpoints] == [
        (0, agent.engine_port),
        (1, agent.engine_port + 1),
    ]
    assert reg.data.devices == ("4", "5", "6", "7") and reg.data.parallel.dp_local == 2
    pub = Publisher(js)
    await pub.publish(start_command(node, reg.data.endpoints))
    await tail.wait(status_of(node, EndpointStatus.READY, 0))
    await tail.wait(status_of(node, EndpointStatus.READY, 1))

    eps = {e["id"]: e for e in (await agent.status())["endpoints"]}
    pids = [eps[0]["pid"], eps[1]["pid"]]
    assert environ(pids[0])["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"
    assert environ(pids[1])["ASCEND_RT_VISIBLE_DEVICES"] == "6,7"
    for pid in pids:
        assert os.getpgid(pid) == pid  # each engine leads its own process group
    assert eps[1]["log_file"].endswith(f"engine-{node}-ep1.log")

    await pub.publish(stop_command(node))
    await tail.wait(status_of(node, EndpointStatus.STOPPED, 0))
    await tail.wait(status_of(node, EndpointStatus.STOPPED, 1))


async def test_hung_health_turns_abnormal_then_ready_again(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = f"n-{new_id()[-10:]}"
    cfg = write_config(
        tmp_path / "cluster.json",
        {
            "health_check_config": {
                "interval": 0.2,
                "timeout": 0.3,
                "retry_attempts": 2,
                "startup_timeout": 60,
            }
        },
    )
    agent = Agent(tmp_path, cfg, node, nats_server.url).start()  # type: ignore[attr-defined]
    agents.append(agent)
    reg = await tail.wait(lambda ev: isinstance(ev, NodeRegistered) and ev.data.node_id == node)
    await Publisher(js).publish(start_command(node, reg.data.endpoints))
    await tail.wait(status_of(node, EndpointStatus.READY))

    url = f"http://127.0.0.1:{agent.engine_port}/admin/faults"
    async with aiohttp.ClientSession() as s, s.post(url, json={"hang_health": True}) as r:
        assert r.status == 200
    abnormal = await tail.wait(status_of(node, EndpointStatus.ABNORMAL))
    assert "timed out 2 times" in abnormal.data.reason  # retry_attempts 2: timeouts only
    assert (await agent.get("/readiness"))[0] == 503

    async with aiohttp.ClientSession() as s, s.post(url, json={"hang_health": False}) as r:
        assert r.status == 200
    back = await tail.wait(status_of(node, EndpointStatus.READY), after=tail.last_index)
    assert back.data.previous == EndpointStatus.ABNORMAL
