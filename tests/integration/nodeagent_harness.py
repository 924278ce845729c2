"""Helpers for the node agent integration tests: a real agent subprocess and an event tail.

Every process a test starts carries a marker in its environment (engines inherit it from
the agent), so cleanup finds and kills the engines too, even when a test fails midway.
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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from nats.aio.client import Client

from core import subjects
from core.events import (
    EndpointSpec,
    InstanceAssembled,
    InstanceAssembledData,
    InstanceMember,
    Role,
    StartCommand,
    StartCommandData,
    StopCommand,
    StopCommandData,
)
from core.ids import new_id
from streams.reader import Record
from tests.follower import Follower

MARKER = "MOTOR_NODEAGENT_TEST"
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_pair() -> int:
    """A port p with p and p+1 both free right now (business + bootstrap)."""
    for _ in range(50):
        p = free_port()
        if p < 65000:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p + 1))
                except OSError:
                    continue
            return p
    raise RuntimeError("no free port pair")


def write_config(
    path: Path, section: dict[str, Any] | None = None, role: str = "union", **nodeagent: Any
) -> Path:
    sec: dict[str, Any] = {
        "engine_type": "builtin",
        "model": "motor-sim",
        "engine_config": {"fast": True, "num_blocks": 512},
        "health_check_config": {"interval": 0.2, "timeout": 1.0, "startup_timeout": 60},
    }
    sec.update(section or {})
    cfg: dict[str, Any] = {
        "nodeagent": {"heartbeat_interval": 0.3, "stop_grace": 3.0, **nodeagent},
        role: sec,
    }
    if role == "prefill":
        cfg["decode"] = dict(sec)
    path.write_bytes(orjson.dumps(cfg))
    return path


def _marked_pids(marker: str) -> list[int]:
    pids = []
    needle = f"{MARKER}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            pids.append(int(entry))
    return pids


def kill_marked(marker: str) -> None:
    """SIGKILL every process carrying `marker` (agent and engines)."""
    for pid in _marked_pids(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in _marked_pids(marker)):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def pid_alive(pid: int) -> bool:
    return _alive(pid)


class Agent:
    """One `motor nodeagent` subprocess."""

    def __init__(
        self, tmp: Path, config: Path, node_id: str, nats_url: str, role: str = "union", **kw: Any
    ) -> None:
        self.tmp = tmp
        self.config = config
        self.node_id = node_id
        self.nats_url = nats_url
        self.role = role
        self.port = kw.pop("port", None) or free_port()
        self.engine_port = kw.pop("engine_port", None) or free_port_pair()
        self.job_name = kw.pop("job_name", "motor")
        self.extra: list[str] = kw.pop("extra", [])
        self.marker = kw.pop("marker", None) or uuid.uuid4().hex
        self.env: dict[str, str] = kw.pop("env", {})  # e.g. MOTOR_NATS_CONTEXT: its credentials
        self.log = tmp / f"agent-{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "deploy.cli", "nodeagent",
            "--config", str(self.config), "--node-id", self.node_id, "--role", self.role,
            "--nats-url", self.nats_url, "--ip", "127.0.0.1", "--port", str(self.port),
            "--engine-port-base", str(self.engine_port), "--job-name", self.job_name,
            "--log-dir", str(self.tmp / "logs"), "--run-dir", str(self.tmp / "run"),
            "--resync-interval", "0.5", *self.extra,
        ]  # fmt: skip

    def start(self) -> Agent:
        env = {**os.environ, **self.env, MARKER: self.marker, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                self.argv(), cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self

    def kill9(self) -> None:
        """Crash the agent only (its engines live in their own sessions)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        kill_marked(self.marker)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def status(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}/node-manager/status") as r:
            body: dict[str, Any] = await r.json()
            return body

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}{path}") as r:
            return r.status, await r.text()


class EventTail:
    """Follows `motor.evt.>` into a list; tests wait for the record they expect."""

    def __init__(self, nc: Client) -> None:
        self.records: list[Record] = []
        self.last_index = -1  # index of the record the last `wait` returned
        self._changed = asyncio.Event()
        self._follower = Follower(nc, filter_subject=subjects.ALL_EVENTS)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> EventTail:
        await self._follower.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for rec in self._follower:
            self.records.append(rec)
            self._changed.set()

    async def wait(self, pred: Callable[[Any], bool], within: float = 30.0, after: int = 0) -> Any:
        """The first event (index >= `after`) matching `pred`; fails after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        i = after
        while True:
            while i < len(self.records):
                ev = self.records[i].event
                i += 1
                if pred(ev):
                    self.last_index = i - 1
                    return ev
            remaining = deadline - loop.time()
            if remaining <= 0:
                seen = [f"{r.seq} {r.event.type}" for r in self.records[after:]][-30:]
                raise AssertionError(f"no matching event within {within}s; last seen: {seen}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # not wait_for: it can eat a cancel on 3.11
                    await self._changed.wait()

    def index(self) -> int:
        return len(self.records)

    def events(self, pred: Callable[[Any], bool], after: int = 0) -> list[Any]:
        return [r.event for r in self.records[after:] if pred(r.event)]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._follower.close()


def assembled(
    node_id: str,
    endpoints: tuple[EndpointSpec, ...],
    *,
    instance_id: int = 7,
    job_name: str = "motor",
    role: Role = Role.UNION,
) -> InstanceAssembled:
    """The controller's assembly of a one-node instance: in a cluster it precedes every start.

    Without it the agent's resync observer finds it runs an instance the log does not know
    and registers again (~2 resync intervals later), re-asserting its endpoints' status.
    """
    member = InstanceMember(node_id=node_id, node_rank=0, ip="127.0.0.1", endpoints=endpoints)
    data = InstanceAssembledData(
        instance_id=instance_id, role=role, engine_type="builtin", model="motor-sim", job_name=job_name,
        members=(member,), master_dp_ip="127.0.0.1",
    )  # fmt: skip
    return InstanceAssembled(id=new_id(), ts=time.time(), source="test/controller", data=data)


def start_command(
    node_id: str,
    endpoints: tuple[EndpointSpec, ...],
    *,
    instance_id: int = 7,
    job_name: str = "motor",
    role: Role = Role.UNION,
    command_id: str | None = None,
) -> StartCommand:
    cid = command_id or new_id()
    data = StartCommandData(
        command_id=cid, node_id=node_id, instance_id=instance_id, job_name=job_name, role=role,
        engine_type="builtin", model="motor-sim", endpoints=endpoints, master_dp_ip="127.0.0.1",
    )  # fmt: skip
    return StartCommand(id=new_id(), ts=time.time(), source="test/controller", data=data)


def stop_command(node_id: str, instance_id: int | None = 7) -> StopCommand:
    data = StopCommandData(command_id=new_id(), node_id=node_id, instance_id=instance_id, reason="test stop")
    return StopCommand(id=new_id(), ts=time.time(), source="test/controller", data=data)
