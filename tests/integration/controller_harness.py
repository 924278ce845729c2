"""Helpers for the controller integration tests: controller subprocesses, a cluster config, a log tail.

Node agents are the real `motor nodeagent` (via the node agent tests' `Agent` helper); every
process carries a marker in its environment so cleanup kills it and its engines even when a
test fails midway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
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

from core.events import EventBase
from core.ids import new_id
from streams.jetstream import JetStreamLog
from streams.livefold import LiveFold
from streams.lostlog import Loss
from streams.reader import Record
from tests.integration.nodeagent_harness import MARKER, Agent, free_port, kill_marked

ROOT = Path(__file__).resolve().parents[2]

# Short timings: heartbeats every 0.3 s, silence after 2 s, a lease of 1.5 s.
CONTROLLER = {
    "heartbeat_timeout": 2.0,
    "terminate_after": 30.0,
    "start_timeout": 10.0,
    "start_attempts": 3,
    "lease_ttl": 1.5,
    "tick_interval": 0.2,
    "checkpoint_every": 20,
}
SECTION = {
    "engine_type": "builtin",
    "model": "motor-sim",
    "engine_config": {"fast": True, "num_blocks": 512},
    "health_check_config": {"interval": 0.2, "timeout": 1.0, "startup_timeout": 30},
}


def cluster_config(
    path: Path,
    *,
    union: int = 0,
    prefill: int = 0,
    decode: int = 0,
    nats: dict[str, Any] | None = None,
    **controller: Any,
) -> Path:
    cfg: dict[str, Any] = {
        "controller": {**CONTROLLER, **controller},
        "nodeagent": {"heartbeat_interval": 0.3, "stop_grace": 3.0},
    }
    if nats:
        cfg["nats"] = nats
    for role, n in (("union", union), ("prefill", prefill), ("decode", decode)):
        if n:
            cfg[role] = {**SECTION, "instances": n}
    path.write_bytes(orjson.dumps(cfg))
    return path


class Controller:
    """One `motor controller` subprocess."""

    def __init__(
        self,
        tmp: Path,
        config: Path,
        nats_url: str,
        cid: str = "c1",
        marker: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp, self.config, self.nats_url, self.id = tmp, config, nats_url, cid
        self.env = env or {}  # e.g. a stepped clock's (tests/faketime.py)
        self.port = free_port()
        self.marker = marker or uuid.uuid4().hex
        self.log = tmp / f"controller-{cid}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Controller:
        argv = [
            sys.executable, "-m", "deploy.cli", "controller", "--config", str(self.config),
            "--nats-url", self.nats_url, "--id", self.id, "--port", str(self.port),
        ]  # fmt: skip
        env = {**os.environ, **self.env, MARKER: self.marker, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def cleanup(self) -> None:
        kill_marked(self.marker)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}{path}") as r:
            text = await r.text()
            try:
                return r.status, orjson.loads(text)
            except orjson.JSONDecodeError:
                return r.status, text

    async def wait_http(self, path: str = "/liveness", within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                status, _ = await self.get(path)
                if status == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"controller {self.id} {path} not 200 within {within}s:\n{self.output()[-3000:]}"
                )
            await asyncio.sleep(0.1)  # polling a process that has no event to await


class LogTail:
    """Follows the whole MOTOR stream (events and commands) into a list, through outages and lost logs.

    After a purge the fold starts over from the stream's first seq: records already tailed are
    not added twice. After a delete-and-recreate sequences start at 1 again: every record is new.
    `losses` lists what the log lost, in order.
    """

    def __init__(self, nc: Client) -> None:
        self.records: list[Record] = []
        self.losses: list[Loss] = []
        self._changed = asyncio.Event()
        self._floor = 0  # after a purge: sequences at or below this were tailed already
        self._fold = LiveFold(
            JetStreamLog(nc), self._apply, on_lost=self._lost, name="test-tail", check_interval=0.5
        )

    async def start(self) -> LogTail:
        await self._fold.start()
        await self._fold.caught_up.wait()
        return self

    def _apply(self, rec: Record) -> None:
        if rec.seq <= self._floor:
            return
        self.records.append(rec)
        self._changed.set()

    def _lost(self, loss: Loss) -> None:
        self.losses.append(loss)
        self._floor = self.records[-1].seq if loss.kind == "purged" and self.records else 0

    def index(self) -> int:
        return len(self.records)

    async def wait(self, pred: Callable[[Any], bool], within: float = 30.0, after: int = 0) -> Any:
        """The first event at index >= `after` matching `pred`; fails after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        i = after
        while True:
            while i < len(self.records):
                ev = self.records[i].event
                i += 1
                if pred(ev):
                    return ev
            remaining = deadline - loop.time()
            if remaining <= 0:
                seen = [f"{r.seq} {r.event.type} {_brief(r.event)}" for r in self.records[after:]][-40:]
                raise AssertionError(f"no matching event within {within}s; last seen:\n" + "\n".join(seen))
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # not wait_for: it can eat a cancel on 3.11
                    await self._changed.wait()

    def events(self, pred: Callable[[Any], bool], after: int = 0) -> list[Any]:
        return [r.event for r in self.records[after:] if pred(r.event)]

    async def close(self) -> None:
        await self._fold.close()


def _brief(ev: Any) -> str:
    d = ev.data
    return " ".join(
        str(x)
        for x in (getattr(d, "node_id", ""), getattr(d, "instance_id", ""), getattr(d, "state", ""))
        if x
    )


def state_is(iid: int, state: str) -> Callable[[Any], bool]:
    return lambda ev: (
        ev.type == "instance.state_changed" and ev.data.instance_id == iid and ev.data.state == state
    )


def assembled(role: str | None = None) -> Callable[[Any], bool]:
    return lambda ev: ev.type == "instance.assembled" and (role is None or ev.data.role == role)


def operator_event(cls: type[EventBase], data: Any) -> Any:
    return cls(id=new_id(), ts=time.time(), source="operator/test", data=data)


def start_agent(
    tmp: Path,
    config: Path,
    node_id: str,
    nats_url: str,
    role: str,
    marker: str,
    env: dict[str, str] | None = None,
) -> Agent:
    return Agent(tmp, config, node_id, nats_url, role=role, marker=marker, env=env or {}).start()


async def engine_pid(agent: Agent, endpoint: int = 0, within: float = 20.0) -> int:
    """The pid of a live engine of the agent (from its status API)."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            st = await agent.status()
            for ep in st.get("endpoints", []):
                if ep["id"] == endpoint and ep["live"]:
                    return int(ep["pid"])
        if time.monotonic() > deadline:
            raise AssertionError(f"no live engine on {agent.node_id}")
        await asyncio.sleep(0.1)


class Cluster:
    """Controllers, node agents (with engines) and a tail of MOTOR for one test; `close` kills all."""

    def __init__(self, tmp: Path, nats_url: str, nc: Client) -> None:
        self.tmp, self.nats_url, self.nc = tmp, nats_url, nc
        self.marker = uuid.uuid4().hex
        self.config: Path | None = None
        self.controllers: dict[str, Controller] = {}
        self.agents: dict[str, Agent] = {}
        self.tail = LogTail(nc)

    def configure(self, **kw: Any) -> Path:
        self.config = cluster_config(self.tmp / "cluster.json", **kw)
        return self.config

    async def start_tail(self) -> None:
        await self.tail.start()

    def controller(self, cid: str = "c1", env: dict[str, str] | None = None) -> Controller:
        assert self.config is not None
        c = Controller(self.tmp, self.config, self.nats_url, cid, marker=self.marker, env=env).start()
        self.controllers[cid] = c
        return c

    def agent(self, node_id: str, role: str = "union", env: dict[str, str] | None = None) -> Agent:
        assert self.config is not None
        a = start_agent(self.tmp, self.config, node_id, self.nats_url, role, self.marker, env)
        self.agents[node_id] = a
        return a

    def logs(self) -> str:
        parts = [f"--- controller {c.id}\n{c.output()[-4000:]}" for c in self.controllers.values()]
        parts += [f"--- agent {a.node_id}\n{a.output()[-2000:]}" for a in self.agents.values()]
        return "\n".join(parts)

    async def close(self) -> None:
        for a in self.agents.values():
            if a.proc is not None and a.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(a.proc.pid, signal.SIGCONT)  # a test may have stopped it
        await self.tail.close()
        kill_marked(self.marker)
        for p in [*self.controllers.values(), *self.agents.values()]:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
