"""A request written to an engine connection that closed meanwhile fails as a transport error."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.proxy.pool import UpstreamPool
from coordinator.proxy.upstream import UpstreamError


async def _send_after_the_engine_closed() -> UpstreamError:
    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # an engine killed right after it accepted

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        pool = UpstreamPool(asyncio.get_running_loop())
        conn = await pool.connect("127.0.0.1", port)
        deadline = asyncio.get_running_loop().time() + 10
        while not conn.closed:  # connection_lost: nothing to await but the protocol's flag
            assert asyncio.get_running_loop().time() < deadline, "the engine's close never arrived"
            await asyncio.sleep(0.01)
        with pytest.raises(UpstreamError) as err:
            await conn.send(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n", 5.0)
        return err.value
    finally:
        server.close()
        await server.wait_closed()


def test_a_request_on_a_connection_the_engine_closed_is_a_transport_failure_under_uvloop() -> None:
    """Regression (`just bench chaos`: HTTP 500 `internal error (RuntimeError)`): the engine
    died between the coordinator's connect and its write; uvloop raised from `write` on the
    closed handle and the handler crashed instead of retrying elsewhere."""
    uvloop = pytest.importorskip("uvloop")
    exc = uvloop.run(_send_after_the_engine_closed())
    assert "closed the connection before the request went out" in str(exc)
    assert not exc.got_bytes and not exc.timeout  # retried elsewhere, or on a fresh connection


async def test_the_same_on_the_stdlib_loop() -> None:
    exc = await _send_after_the_engine_closed()
    assert not exc.got_bytes and not exc.timeout
