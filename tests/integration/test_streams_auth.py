"""Authenticated servers: the client and the raw reader both log in; bad credentials are clear."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from streams.connection import NatsOptions, connect
from streams.definitions import ensure_streams
from streams.errors import NatsUnavailable
from streams.publisher import Publisher
from streams.reader import Record
from streams.server import EmbeddedNats
from tests.follower import Follower
from tests.integration.streams_events import mixed

AUTH = """
authorization {
  users = [ { user: "motor", password: "pw1" } ]
}
"""


@pytest_asyncio.fixture(loop_scope="session")
async def auth_server(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats", extra_conf=AUTH)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_user_password_reaches_publisher_and_raw_follower(auth_server: EmbeddedNats) -> None:
    nc = await connect(NatsOptions(urls=[auth_server.url], user="motor", password="pw1"), name="auth-test")
    follower = Follower(nc)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        events = mixed(5)
        pub = Publisher(js)
        for ev in events:
            await pub.publish(ev)
        got: list[Record] = []

        async def take() -> None:
            async for rec in follower:
                got.append(rec)
                if len(got) == 5:
                    return

        await asyncio.wait_for(take(), 60)
        assert follower.transport == "raw"
        assert [r.event for r in got] == events
    finally:
        await follower.close()
        await nc.close()


async def test_wrong_password_is_a_clear_error(auth_server: EmbeddedNats) -> None:
    with pytest.raises(NatsUnavailable, match=r"(?i)authorization"):
        await connect(NatsOptions(urls=[auth_server.url], user="motor", password="nope"), name="auth-test")


async def test_token_auth_reaches_the_raw_follower(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "tok", extra_conf='authorization { token: "s3cret" }')
    await server.start()
    nc = None
    follower = None
    try:
        nc = await connect(NatsOptions(urls=[server.url], token="s3cret"), name="token-test")
        js = nc.jetstream()
        await ensure_streams(js)
        await Publisher(js).publish(mixed(1)[0])
        follower = Follower(nc)
        rec = await asyncio.wait_for(anext(aiter(follower)), 60)
        assert follower.transport == "raw"
        assert rec.seq == 1
    finally:
        if follower is not None:
            await follower.close()
        if nc is not None:
            await nc.close()
        await server.stop()
