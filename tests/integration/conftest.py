"""Fixtures shared by the integration tests: node agents, and controller clusters."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext

from streams.server import EmbeddedNats
from tests.integration.controller_harness import Cluster
from tests.integration.nodeagent_harness import Agent, EventTail


@pytest_asyncio.fixture(loop_scope="session")
async def tail(nc: Client, js: JetStreamContext) -> AsyncIterator[EventTail]:
    """Every MOTOR event from the start of the test, as the agents publish them."""
    t = await EventTail(nc).start()
    try:
        yield t
    finally:
        await t.close()


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    """Agents a test starts; each is cleaned up (with its engines) afterwards."""
    made: list[Agent] = []
    try:
        yield made
    finally:
        for a in made:
            a.cleanup()


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Controllers and node agents (with engines) of one test, and a tail of MOTOR; all killed after."""
    c = Cluster(tmp_path, nats_server.url, nc)
    await c.start_tail()
    try:
        yield c
    finally:
        await c.close()
