"""Fixtures shared by the node-agent integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext

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
