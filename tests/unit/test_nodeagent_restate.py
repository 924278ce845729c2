"""The node agent restates its registration at half of MOTOR's max_age (issue 24 item 3).

The real resync `Observer` on the in-memory log (`streams.memory`, the `Log` the contract test
holds to JetStream's behaviour) whose MOTOR keeps events a minute, with the agent's monotonic
clock in the test's hand.
"""

from __future__ import annotations

import asyncio

from core.config import NatsConfig
from core.events import NodeRegistered
from nodeagent.resync import Observer, Running
from streams.memory import MemoryLog, MemoryServer
from tests.unit.factories import registered

MAX_AGE = 60.0


async def test_the_registration_is_restated_at_half_of_max_age_and_not_before() -> None:
    server = MemoryServer()
    server.ensure_streams(NatsConfig(max_age_days=MAX_AGE / 86400))
    motor = MemoryLog(server)
    clock = [1000.0]
    said: list[str] = []
    again: list[str] = []

    async def reregister(why: str) -> None:
        again.append(why)

    async def restate(why: str) -> None:
        said.append(why)
        obs.registered_at(await motor.publisher().publish(_restated()))

    obs = Observer(
        motor,
        "n1",
        lambda: Running(None, (), 0),
        reregister,
        interval=1.0,
        restate=restate,
        monotonic=lambda: clock[0],
    )
    await obs.start()
    try:
        obs.registered_at(await motor.publisher().publish(registered("n1")))
        await asyncio.wait_for(obs.caught_up.wait(), 5)
        await obs.check()
        clock[0] += MAX_AGE / 2 - 1
        await obs.check()
        assert said == []
        clock[0] += 1
        await obs.check()
        assert len(said) == 1 and "max_age of 60s" in said[0]
        await obs.check()  # said again a moment ago: not due
        assert len(said) == 1 and again == []
    finally:
        await obs.close()
        await motor.close()


def _restated() -> NodeRegistered:
    ev = registered("n1", ts=2.0)
    return ev.model_copy(update={"data": ev.data.model_copy(update={"restated": True})})
