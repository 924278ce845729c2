"""The simulated network: latency, outages that hold or lose requests, cut links, lost answers."""

from __future__ import annotations

import asyncio
import random

import pytest

from streams.definitions import MOTOR_STREAM
from streams.errors import PublishTimeout
from streams.memory import MemoryLog, MemoryServer
from tests.integration.streams_events import status_changed
from tests.sim.loop import SimLoop
from tests.sim.network import Network


def run(main):  # type: ignore[no-untyped-def]
    loop = SimLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def world(loop: SimLoop, hold: float) -> tuple[MemoryServer, Network, MemoryLog]:
    server = MemoryServer(clock=loop.wall)
    server.ensure_streams(lease_ttl=2.0)
    net = Network(loop, random.Random(1))
    net.hold_share = hold
    return server, net, MemoryLog(server, net.link("c"))


def test_a_trip_takes_virtual_latency() -> None:
    async def main(loop: SimLoop) -> float:
        _, _, log = world(loop, 0.0)
        await log.publisher().publish(status_changed(0))
        return loop.time()

    took = run(main)
    assert 0.0004 <= took <= 0.004


def test_a_request_kept_through_an_outage_lands_after_its_caller_gave_up() -> None:
    async def main(loop: SimLoop) -> tuple[int, int]:
        server, net, log = world(loop, 1.0)
        net.set_outage(True)
        with pytest.raises(PublishTimeout):
            await log.publisher(ack_timeout=1.0).publish(status_changed(0))
        before = server.stream(MOTOR_STREAM).last_seq
        net.set_outage(False)
        await asyncio.sleep(0.1)
        return before, server.stream(MOTOR_STREAM).last_seq

    assert run(main) == (0, 1)


def test_a_request_into_a_dead_connection_is_lost() -> None:
    async def main(loop: SimLoop) -> int:
        server, net, log = world(loop, 0.0)
        link = net.links[0]
        link.set_cut(True)
        assert not log.connected
        with pytest.raises(PublishTimeout):
            await log.publisher(ack_timeout=1.0).publish(status_changed(0))
        link.set_cut(False)
        await asyncio.sleep(0.1)
        return server.stream(MOTOR_STREAM).last_seq

    assert run(main) == 0


def test_a_lost_answer_leaves_the_append_in_the_log() -> None:
    async def main(loop: SimLoop) -> tuple[int, int]:
        server, net, log = world(loop, 0.0)
        pub = log.publisher(ack_timeout=1.0)
        seq = await pub.publish(status_changed(0))
        # Requests and answers lost half the time: retries of one event land it once.
        net.rng = random.Random(3)
        net.links[0].loss = 0.5
        for _ in range(10):
            try:
                await pub.publish(status_changed(1))
                break
            except PublishTimeout:
                continue
        net.links[0].loss = 0.0
        return seq, server.stream(MOTOR_STREAM).view(loop.wall()).messages

    seq, messages = run(main)
    assert seq == 1 and messages == 2
