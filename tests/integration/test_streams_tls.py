"""TLS: the client and the raw reader both upgrade when the server requires it."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from streams.connection import NatsOptions, connect
from streams.definitions import ensure_streams
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.follower import Follower
from tests.integration.streams_events import mixed


def _make_certs(d: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=motor-test-ca",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf",
    )  # fmt: skip
    return d / "ca.pem", d / "server.pem", d / "server.key"


async def test_tls_server_reaches_client_and_raw_follower(tmp_path: Path) -> None:
    ca, cert, key = await asyncio.to_thread(_make_certs, tmp_path)
    server = EmbeddedNats(tmp_path / "nats", extra_conf=f'tls {{ cert_file: "{cert}"\n key_file: "{key}" }}')
    await server.start()
    nc = None
    follower = None
    try:
        nc = await connect(NatsOptions(urls=[server.url], tls_ca=str(ca)), name="tls-test")
        js = nc.jetstream()
        await ensure_streams(js)
        events = mixed(3)
        pub = Publisher(js)
        for ev in events:
            await pub.publish(ev)
        follower = Follower(nc)
        it = aiter(follower)
        got = [await asyncio.wait_for(anext(it), 60) for _ in events]
        assert follower.transport == "raw"
        assert [r.event for r in got] == events
    finally:
        if follower is not None:
            await follower.close()
        if nc is not None:
            await nc.close()
        await server.stop()
