"""Real parts for the coordinator's integration tests: builtin engine processes, a coordinator
process, and the events a controller and node agents would append to route to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from core.events import (
    Capacity,
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    Heartbeat,
    HeartbeatData,
    InstanceAssembled,
    InstanceAssembledData,
    InstanceMember,
    InstanceState,
    InstanceStateChanged,
    InstanceStateChangedData,
    NodeRegistered,
    NodeRegisteredData,
    Role,
)
from core.ids import new_id
from streams.publisher import Publisher

ROOT = Path(__file__).resolve().parents[2]
MODEL = "motor-sim"


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_http(url: str, within: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200 (fails early if `proc` exits)."""
    deadline = time.monotonic() + within
    last: object = None
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
            try:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
                    last = r.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = exc
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 within {within}s (last: {last!r})")


def _spawn(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@dataclass
class Engine:
    """One builtin engine process."""

    port: int
    role: str
    proc: subprocess.Popen[bytes]
    log: Path
    bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        _stop(self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None


async def start_engine(
    tmp: Path, role: str = "union", *args: str, bootstrap: bool = False, port: int | None = None
) -> Engine:
    """Start a builtin engine (`--fast` unless speeds are given) and wait for /health."""
    port = port or free_port()
    bport = free_port() if bootstrap else None
    argv = ["engine", "builtin", "--port", str(port), "--role", role, "--model", MODEL, *args]
    if bport is not None:
        argv += ["--bootstrap-port", str(bport)]
    log = tmp / f"engine-{role}-{port}.log"
    proc = _spawn(argv, log)
    eng = Engine(port, role, proc, log, bport)
    try:
        await wait_http(f"{eng.url}/health", proc=proc)
    except BaseException:
        eng.stop()
        raise
    return eng


@dataclass
class Coordinator:
    """One `motor coordinator` process."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        _stop(self.proc)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


async def start_coordinator(tmp: Path, nats_url: str, **coordinator: Any) -> Coordinator:
    """Start `motor coordinator` with the given `coordinator:` config section."""
    port = free_port()
    cfg = {"union": {"instances": 1}, "coordinator": coordinator}
    path = tmp / f"coordinator-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp / f"coordinator-{port}.log"
    proc = _spawn(["coordinator", "--config", str(path), "--nats-url", nats_url, "--port", str(port)], log)
    coord = Coordinator(port, proc, log)
    try:
        await wait_http(f"{coord.url}/liveness", proc=proc)
    except BaseException:
        coord.stop()
        raise
    return coord


class Cluster:
    """Appends the events that make engines routable, as the controller and node agents would."""

    def __init__(self, publisher: Publisher) -> None:
        self.pub = publisher
        self.ts = time.time()
        self.next_instance = 1

    def _ts(self) -> float:
        self.ts += 0.001
        return self.ts

    async def add(
        self,
        eng: Engine,
        *,
        engine_type: str = "builtin",
        capabilities: Sequence[str] = (),
        model: str = MODEL,
        max_seq_len: int | None = None,
    ) -> int:
        """Register, assemble, activate and mark READY one single-node instance for `eng`."""
        iid = self.next_instance
        self.next_instance += 1
        node = f"n{eng.port}"
        ep = EndpointSpec(
            id=0,
            ip="127.0.0.1",
            business_port=eng.port,
            mgmt_port=eng.port,
            bootstrap_port=eng.bootstrap_port,
        )
        role = Role(eng.role)
        src = f"nodeagent/{node}"
        await self.pub.publish(
            NodeRegistered(
                id=new_id(),
                ts=self._ts(),
                source=src,
                data=NodeRegisteredData(
                    node_id=node,
                    job_name="motor",
                    pod_ip="127.0.0.1",
                    role=role,
                    engine_type=engine_type,
                    model=model,
                    endpoints=(ep,),
                    capabilities=tuple(capabilities),
                    capacity=Capacity() if max_seq_len is None else Capacity(max_seq_len=max_seq_len),
                ),
            )
        )
        member = InstanceMember(node_id=node, node_rank=0, ip="127.0.0.1", endpoints=(ep,))
        await self.pub.publish(
            InstanceAssembled(
                id=new_id(),
                ts=self._ts(),
                source="controller/test",
                data=InstanceAssembledData(
                    instance_id=iid,
                    role=role,
                    engine_type=engine_type,
                    model=model,
                    job_name="motor",
                    members=(member,),
                    master_dp_ip="127.0.0.1",
                    capabilities=tuple(capabilities),
                ),
            )
        )
        await self.pub.publish(
            InstanceStateChanged(
                id=new_id(),
                ts=self._ts(),
                source="controller/test",
                data=InstanceStateChangedData(instance_id=iid, state=InstanceState.ACTIVE),
            )
        )
        await self.status(eng, iid, EndpointStatus.READY)
        return iid

    async def status(
        self, eng: Engine, iid: int, status: EndpointStatus, previous: EndpointStatus | None = None
    ) -> int:
        """Say what a node agent would about `eng`'s endpoint (with its pid); the MOTOR sequence."""
        node = f"n{eng.port}"
        return await self.pub.publish(
            EndpointStatusChanged(
                id=new_id(),
                ts=self._ts(),
                source=f"nodeagent/{node}",
                data=EndpointStatusChangedData(
                    node_id=node,
                    endpoint_id=0,
                    instance_id=iid,
                    status=status,
                    previous=previous,
                    pid=eng.proc.pid if hasattr(eng, "proc") else None,  # a stand-in has no process
                ),
            )
        )

    async def load(self, eng: Engine, iid: int, running: int) -> None:
        """A heartbeat saying `eng` runs `running` requests (steers load-aware routing)."""
        node = f"n{eng.port}"
        await self.pub.publish(
            Heartbeat(
                id=new_id(),
                ts=self._ts(),
                source=f"nodeagent/{node}",
                data=HeartbeatData(
                    node_id=node,
                    instance_id=iid,
                    endpoints=(EndpointLoad(id=0, status=EndpointStatus.READY, running=running),),
                ),
            )
        )


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST JSON; (status, parsed body, headers)."""
    async with session.post(url, data=orjson.dumps(body), headers=headers or {}) as r:
        data = await r.read()
        return r.status, orjson.loads(data) if data else {}, {k.lower(): v for k, v in r.headers.items()}


async def stream_text(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """POST a streaming request; (concatenated text, every chunk)."""
    chunks: list[dict[str, Any]] = []
    buf = b""
    async with session.post(url, data=orjson.dumps(body)) as r:
        assert r.status == 200, await r.text()
        async for data in r.content.iter_any():
            buf += data
    for block in buf.split(b"\n\n"):
        block = block.strip()
        if not block.startswith(b"data:"):
            continue
        payload = block[5:].strip()
        if payload == b"[DONE]":
            chunks.append({"done": True})
            continue
        chunks.append(orjson.loads(payload))
    text = ""
    for c in chunks:
        for ch in c.get("choices", []):
            delta = ch.get("delta")
            text += (delta.get("content") or "") if isinstance(delta, dict) else (ch.get("text") or "")
    return text, chunks


async def assert_stream_survives_death(c: Coordinator, dying: Engine, body: dict[str, Any]) -> None:
    """Stream `body` until `dying` (set to die mid-stream) has died serving one; the client
    must still have seen one whole stream: one id, the full token budget, [DONE]."""
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            text, chunks = await stream_text(s, f"{c.url}/v1/completions", body)
            if not dying.alive():
                break
    assert not dying.alive(), "the dying engine never served a stream"
    pieces = [ch for ch in chunks if "choices" in ch]
    assert len({ch["id"] for ch in pieces}) == 1
    assert sum(1 for ch in pieces if ch["choices"][0]["text"]) == body["max_tokens"]
    assert chunks[-1] == {"done": True}
    assert text
    assert "continuing elsewhere" in c.log_text()


async def wait_routable(
    coord: Coordinator,
    body: dict[str, Any] | None = None,
    within: float = 30.0,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll with a one-token completion until the coordinator routes it (200)."""
    body = body or {"model": MODEL, "prompt": "ping", "max_tokens": 1}
    deadline = time.monotonic() + within
    last: object = None
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            status, data, _ = await post(s, f"{coord.url}/v1/completions", body, headers)
            if status == 200:
                return
            last = (status, data)
            await asyncio.sleep(0.05)
    raise TimeoutError(f"coordinator never routed a request: {last!r}")
