"""Anonymous clients against a keyed coordinator (issue 24, item 2): the key is checked on the
request head before any body byte is read, a whole body owes its deadline, and connections
that never presented a key are the ones evicted at the cap, so 10,000 trickling anonymous
connections neither lock a keyed client out nor grow the coordinator's memory.
"""

from __future__ import annotations

import asyncio
import resource
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    ROOT,
    Cluster,
    Coordinator,
    Engine,
    start_coordinator,
    start_engine,
    wait_routable,
)
from tests.integration.rawhttp import closed_within, exchange, read_reply, request

USER = "user-key-1"
AS_USER = {"authorization": f"Bearer {USER}"}
CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
MAX_BODY = 8 * 1024 * 1024  # coordinator.max_body_bytes' default

ATTACKERS = 10_000  # `trickle_swarm`'s connections (its modes and pace are described there)
KEYED_REQUESTS = 100
KEYED_EVERY = 0.1  # seconds between the keyed client's requests, each on a new connection
CAP = 4096  # coordinator.http.max_connections' default
P99_BOUND = 1.0  # seconds
# The coordinator's RSS may grow this much under the attack. Without head-first auth the
# swarm's 40 flooders alone would hold 40 * 8 MiB = 320 MiB of bodies; with it an untrusted
# connection holds at most a head (73 KiB by the head limits, a few hundred bytes here) and
# its protocol objects, so 4096 of them stay well under this.
RSS_GROWTH_BOUND = 160 * 1024 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    eng = await start_engine(tmp_path_factory.mktemp("eng"), "union", "--fast")
    yield eng
    eng.stop()


async def _keyed(
    tmp: Path, nats_url: str, js: JetStreamContext, engine: Engine, **http: float
) -> Coordinator:
    c = await start_coordinator(tmp, nats_url, api_keys=[USER], http=http)
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c, headers=AS_USER)
    except BaseException:
        c.stop()
        raise
    return c


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> AsyncIterator[Coordinator]:
    c = await _keyed(tmp_path, nats_server.url, js, engine, body_timeout=1.5, idle_timeout=60.0)
    try:
        yield c
    finally:
        c.stop()


async def test_a_keyless_head_is_refused_before_its_body_is_sent(coord: Coordinator) -> None:
    for path, anthropic in (("/v1/chat/completions", False), ("/v1/messages", True)):
        reader, writer = await asyncio.open_connection("127.0.0.1", coord.port)
        try:
            # The head announces 8 MiB; not one body byte is sent, and the answer comes anyway.
            writer.write(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {MAX_BODY}\r\n\r\n".encode())
            reply = await read_reply(reader, within=5)
            closed, _ = await closed_within(reader, 5)
        finally:
            writer.close()
        assert reply.status == 401, reply
        assert reply.headers.get("www-authenticate") == 'Bearer realm="motor"'
        body = reply.json()
        assert isinstance(body, dict)
        if anthropic:
            assert body["type"] == "error" and body["error"]["type"] == "authentication_error", body
        else:
            assert body["error"]["code"] == "invalid_api_key", body
        assert closed, "the connection of a refused head stayed open"


async def test_a_wrong_key_is_refused_on_the_head_and_a_right_one_is_served(coord: Coordinator) -> None:
    wrong = await exchange(coord.port, request("POST", "/v1/chat/completions", CHAT, {"x-api-key": "nope"}))
    assert wrong.status == 401
    right = await exchange(coord.port, request("POST", "/v1/chat/completions", CHAT, {"x-api-key": USER}))
    assert right.status == 200, right
    probe = await exchange(coord.port, request("GET", "/liveness"))
    assert probe.status == 200


async def test_a_keyless_body_on_a_public_route_is_held_to_16_kib(coord: Coordinator) -> None:
    r = await exchange(coord.port, request("POST", "/liveness", b"x" * (64 * 1024)))
    assert r.status == 413, r
    assert (await exchange(coord.port, request("GET", "/liveness"))).status == 200


async def test_a_trickled_body_meets_the_body_deadline(coord: Coordinator) -> None:
    # A keyed client (the head passes) whose body trickles a byte every 0.2 s: each byte
    # resets the 60 s idle timer, but the 1.5 s deadline from the end of the head holds.
    reader, writer = await asyncio.open_connection("127.0.0.1", coord.port)
    head = request("POST", "/v1/chat/completions", b"", AS_USER).replace(
        b"content-length: 0", b"content-length: 1000"
    )
    writer.write(head)
    t0 = time.monotonic()

    async def drip() -> None:
        for _ in range(1000):
            writer.write(b" ")
            await asyncio.sleep(0.2)

    dripping = asyncio.create_task(drip())
    try:
        reply = await read_reply(reader, within=10)
    finally:
        dripping.cancel()
        writer.close()
    took = time.monotonic() - t0
    assert reply.status == 408, reply
    assert reply.json()["error"]["code"] == "body_deadline"  # type: ignore[index]
    assert 1.5 * 0.9 <= took < 1.5 + 3.0, took


def _rss(pid: int) -> int:
    """The resident set of process `pid`, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


CONNS = "motor_coordinator_http_connections "
EVICTED = 'motor_coordinator_http_rejected_total{code="connection_evicted"'
UNKEYED = 'motor_coordinator_http_rejected_total{code="invalid_api_key"'


async def _metrics(port: int) -> str:
    return (await exchange(port, request("GET", "/metrics"), within=30)).body.decode()


async def _at_the_cap(port: int) -> str:
    """The coordinator's metrics once the attack holds (nearly) every connection slot."""
    deadline = time.monotonic() + 60
    while True:
        text = await _metrics(port)
        if _metric(text, CONNS) >= CAP * 0.95 or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.5)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _swarm(port: int) -> asyncio.subprocess.Process:
    """The attack (`trickle_swarm`), its own process; returns once every attacker connected once."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.trickle_swarm", str(port), str(ATTACKERS),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 180)
    assert line.strip() == b"ramped", line
    return proc


async def _stop_swarm(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """End the attack; what it counted."""
    assert proc.stdout is not None
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out = await asyncio.wait_for(proc.stdout.read(), 30)
    except TimeoutError:
        proc.kill()
        out = b"{}"
    await proc.wait()
    lines = out.strip().splitlines()
    counts = orjson.loads(lines[-1]) if lines else {}
    assert isinstance(counts, dict)
    return counts


async def _keyed_requests(port: int, n: int) -> tuple[list[float], Counter[int]]:
    """`n` chat requests with the key, each on a new connection (which must win a slot):
    their latencies, sorted, from connect to the whole answer, and their statuses."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    for _ in range(n):
        t0 = time.monotonic()
        r = await exchange(port, request("POST", "/v1/chat/completions", CHAT, AS_USER), within=30)
        latencies.append(time.monotonic() - t0)
        statuses[r.status] += 1
        await asyncio.sleep(KEYED_EVERY)
    return sorted(latencies), statuses


def _p(latencies: list[float], q: float) -> float:
    """The `q` quantile of sorted `latencies` (the nearest rank at or above it)."""
    return latencies[min(len(latencies) - 1, int(len(latencies) * q))]


@pytest.mark.timeout(600)
async def test_ten_thousand_trickling_anonymous_connections_leave_a_keyed_client_served(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < ATTACKERS + 1000:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {ATTACKERS + 1000}")
    # Default limits: max_connections 4096, header 10 s, body 30 s, idle 60 s.
    c = await _keyed(tmp_path, nats_server.url, js, engine)
    swarm: asyncio.subprocess.Process | None = None
    counts: dict[str, Any] = {}
    try:
        quiet, _ = await _keyed_requests(c.port, 20)  # warm, and the machine's own figure
        pid = c.proc.pid
        baseline = peak = _rss(pid)

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, _rss(pid))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        t0 = time.monotonic()
        swarm = await _swarm(c.port)
        ramp = time.monotonic() - t0
        before = await _at_the_cap(c.port)
        latencies, statuses = await _keyed_requests(c.port, KEYED_REQUESTS)
        after = await _metrics(c.port)
        sampler.cancel()
        peak = max(peak, _rss(pid))
    finally:
        if swarm is not None:
            counts = await _stop_swarm(swarm)
        c.stop()
    p99 = _p(latencies, 0.99)
    evicted = _metric(after, EVICTED) - _metric(before, EVICTED)
    unkeyed = _metric(after, UNKEYED) - _metric(before, UNKEYED)
    figures = (
        f"TRICKLE attackers={ATTACKERS} ramp_s={ramp:.1f} keyed={KEYED_REQUESTS} "
        f"p50_ms={_p(latencies, 0.5) * 1000:.0f} p99_ms={p99 * 1000:.0f} "
        f"max_ms={latencies[-1] * 1000:.0f} quiet_max_ms={quiet[-1] * 1000:.0f} "
        f"rss_base_mib={baseline / 2**20:.0f} rss_peak_mib={peak / 2**20:.0f} "
        f"conns={_metric(before, CONNS):.0f}..{_metric(after, CONNS):.0f} "
        f"evicted_meanwhile={evicted:.0f} refused_401_meanwhile={unkeyed:.0f} swarm={counts}"
    )
    print(figures)
    assert statuses == {200: KEYED_REQUESTS}, (statuses, figures)
    # Evictions happen only at the cap: it was full while the keyed client was served.
    assert _metric(before, CONNS) >= CAP * 0.95, figures
    assert evicted > 0 and unkeyed > 0, figures
    assert p99 < P99_BOUND, figures
    assert peak - baseline < RSS_GROWTH_BOUND, figures
