"""Fuzzing the coordinator's /v1 port (issue 12): Hypothesis-made JSON bodies and raw HTTP/1.1
requests for chat, completions, embeddings, messages, the native routes (generate, score,
rerank, tokenize) and refresh, against a real coordinator
in front of a real builtin engine. Zero 5xx, zero crashed processes, every 4xx with a
well-formed error body. `MOTOR_FUZZ_EXAMPLES` sets the examples (`just fuzz` runs many).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import MODEL as SERVED
from tests.integration.coord_harness import (
    Cluster,
    Coordinator,
    Engine,
    free_port,
    start_coordinator,
    start_engine,
    wait_routable,
)
from tests.integration.fuzz import (
    FUZZ_LIMITS,
    SETTINGS,
    RawRequest,
    anthropic_bodies,
    check_reply,
    native_bodies,
    openai_bodies,
    raw_requests,
    refresh_bodies,
    send_raw,
)

USER, ADMIN = "fuzz-user-key", "fuzz-admin-key"
AS_USER = {"authorization": f"Bearer {USER}"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    eng = await start_engine(tmp_path_factory.mktemp("eng"), "union", "--fast")
    yield eng
    eng.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(
        tmp_path, nats_server.url, api_keys=[USER], admin_keys=[ADMIN], http=FUZZ_LIMITS
    )
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c, headers=AS_USER)
        yield c
    finally:
        c.stop()


def _alive(*procs: Coordinator | Engine) -> None:
    for p in procs:
        assert p.proc.poll() is None, f"{p} exited with {p.proc.returncode}"


def _no_tracebacks(c: Coordinator) -> None:
    text = c.log_text()
    assert "Traceback" not in text and "never retrieved" not in text, text[-3000:]


def _bodies() -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    return {**openai_bodies(SERVED), **anthropic_bodies(SERVED), **native_bodies(SERVED)}


async def test_fuzz_json_bodies(coord: Coordinator, engine: Engine) -> None:
    """Well-framed requests with a user key: only the bodies vary."""
    paths = _bodies()

    @SETTINGS
    @given(path=st.sampled_from(sorted(paths)), data=st.data())
    def run(path: str, data: st.DataObject) -> None:
        import orjson

        payload = orjson.dumps(data.draw(paths[path]))
        head = f"POST {path} HTTP/1.1\r\nhost: f\r\nauthorization: Bearer {USER}\r\nconnection: close\r\ncontent-length: {len(payload)}\r\n\r\n"
        replies = send_raw(coord.port, head.encode() + payload)
        assert replies, "no answer to a complete request"
        for r in replies:
            check_reply(r)

    await asyncio.to_thread(run)
    _alive(coord, engine)
    _no_tracebacks(coord)


async def test_fuzz_raw_requests(coord: Coordinator, engine: Engine) -> None:
    """Whole requests: methods, mangled paths, headers, framing, auth and bodies all vary.
    Refresh is reached without the admin key here (its own test holds the key)."""
    paths = {
        **_bodies(),
        "/v1/instances/refresh": refresh_bodies(free_port()),
        "/instances/refresh": refresh_bodies(1),
    }

    @SETTINGS
    @given(req=raw_requests(paths, [USER, USER + "x"]))
    def run(req: RawRequest) -> None:
        for r in send_raw(coord.port, req.data, head=req.method == "HEAD"):
            check_reply(r)

    await asyncio.to_thread(run)
    _alive(coord, engine)
    _no_tracebacks(coord)


async def test_fuzz_refresh(tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext) -> None:
    """Refresh bodies with the admin key, on their own coordinator (what they register points
    nowhere: nothing is routed here)."""
    c = await start_coordinator(
        tmp_path, nats_server.url, api_keys=[USER], admin_keys=[ADMIN], http=FUZZ_LIMITS
    )
    try:
        paths = {
            "/v1/instances/refresh": refresh_bodies(free_port()),
            "/instances/refresh": refresh_bodies(free_port()),
        }

        @SETTINGS
        @given(req=raw_requests(paths, [ADMIN]))
        def run(req: RawRequest) -> None:
            for r in send_raw(c.port, req.data, head=req.method == "HEAD"):
                check_reply(r)

        await asyncio.to_thread(run)
        _alive(c)
        _no_tracebacks(c)
    finally:
        c.stop()
