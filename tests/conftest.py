"""Shared fixtures: one real nats-server for the session, a client and a clean JetStream per test.

The chain is store dir -> server -> client -> jetstream. The server runs on free ports;
`js` deletes every Motor stream and KV bucket and applies `ensure_streams` again, so each test
starts from an empty log without paying for a new server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from streams import permissions
from streams.connection import connect
from streams.definitions import (
    ensure_streams,
)
from streams.server import EmbeddedNats

ANCHOR_STREAM = "PYTEST_ANCHOR"
ALL_STREAMS = permissions.ALL_STREAMS


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def nats_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedNats]:
    """One real nats-server (JetStream, file store) for the whole test session."""
    base: Path = tmp_path_factory.mktemp("nats")
    server = EmbeddedNats(base / "data", log_file=base / "nats-server.log")
    await server.start()
    try:
        await _anchor_the_account_store(server)
        yield server
    finally:
        await server.stop()


async def _anchor_the_account_store(server: EmbeddedNats) -> None:
    """Keep one stream no test deletes, so the account's store directory never empties.

    Deleting an account's last stream makes nats-server remove the account's store
    directories in the background; a stream created at that moment (the `js` fixture deletes
    every Motor stream, then creates them) fails with "could not create storage directory"
    (seen as "error creating store for stream" on a loaded machine).
    """
    client = await connect(server.url, name="pytest-anchor")
    try:
        await client.jetstream().add_stream(StreamConfig(name=ANCHOR_STREAM, subjects=["pytest.anchor"]))
    finally:
        await client.close()


@pytest_asyncio.fixture(loop_scope="session")
async def nc(nats_server: EmbeddedNats) -> AsyncIterator[Client]:
    """A connected client, closed after the test."""
    client = await connect(nats_server.url, name="pytest")
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            await client.close()


@pytest_asyncio.fixture(loop_scope="session")
async def js(nc: Client) -> JetStreamContext:
    """JetStream with Motor's streams and buckets fresh: empty, default config, seq from 1."""
    ctx = nc.jetstream()
    # Deleted rather than purged: a purge keeps the dedupe window, so an event id used by an
    # earlier test would be silently dropped in this one. Checked: on a loaded machine a
    # fresh MOTOR once held an earlier test's 600 events (and a test publishing the same ids
    # was deduplicated against them), so a stream that is not empty is deleted again.
    for attempt in range(5):
        for name in ALL_STREAMS:
            with contextlib.suppress(NotFoundError):
                await ctx.delete_stream(name)
        await ensure_streams(ctx)
        left = {name: (await ctx.stream_info(name)).state.messages for name in ALL_STREAMS}
        if not any(left.values()):
            return ctx
        print(f"js fixture: fresh streams not empty after delete (attempt {attempt + 1}): {left}")
        await asyncio.sleep(0.5)
    raise AssertionError(f"Motor's streams could not be made empty: {left}")
