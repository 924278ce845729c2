"""What the chaos suite reads off the fleet: the fold's instances and engines, the engines'
own counters (served tokens, running requests) and processes, and probe bursts of requests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import aiohttp
import openai

from core.events import InstanceState, Role
from core.state import ClusterState
from tests.chaos.load import SPECS, LoadGen, Outcome, run_one
from tests.localcluster import engine_pid

ROLES = (Role.UNION, Role.PREFILL, Role.DECODE)


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine endpoint of an instance, as the fold places it."""

    role: Role
    instance_id: int
    node_id: str
    port: int

    @property
    def label(self) -> str:
        return f"{self.role.value} engine ({self.node_id}:{self.port})"


def converged(state: ClusterState) -> bool:
    """One ACTIVE instance per role, every endpoint of it READY."""
    return all(_active(state, role) for role in ROLES)


def _active(state: ClusterState, role: Role) -> bool:
    for inst in state.instances.values():
        if inst.spec.role != role or inst.state != InstanceState.ACTIVE:
            continue
        nodes = [state.nodes.get(m.node_id) for m in inst.spec.members]
        if all(n is not None and n.all_ready() for n in nodes):
            return True
    return False


def engines(state: ClusterState) -> list[Engine]:
    """Every engine endpoint of every ACTIVE instance."""
    out = []
    for iid, inst in sorted(state.instances.items()):
        if inst.state != InstanceState.ACTIVE:
            continue
        for m in inst.spec.members:
            for ep in m.endpoints:
                out.append(Engine(inst.spec.role, iid, m.node_id, ep.business_port))
    return out


async def scrape(url: str, limit: float = 5.0, *, unix: str | None = None) -> str | None:
    """GET `url` on a new connection (through the Unix socket `unix`, when given); the body,
    or None when it does not answer 200."""
    try:
        async with (
            aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=limit),
                connector=aiohttp.UnixConnector(path=unix) if unix is not None else None,
            ) as s,
            s.get(url) as r,
        ):
            return await r.text() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


def counter(text: str | None, *names: str) -> float:
    """Sum of the samples of the named metrics (any labels) in a Prometheus text body."""
    if text is None:
        return 0.0
    total = 0.0
    for line in text.splitlines():
        if line.startswith(names):
            with contextlib.suppress(ValueError):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def served(port: int) -> float:
    """Tokens the engine on `port` processed so far (0 while it is down)."""
    text = await scrape(f"http://127.0.0.1:{port}/metrics")
    return counter(text, "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


async def replica_served(probe_socket: str) -> float:
    """Client requests one coordinator replica answered so far, asked on its own socket (the
    shared port would answer from any replica)."""
    text = await scrape("http://replica/metrics", unix=probe_socket)
    return counter(text, "motor_coordinator_requests_total")


async def running(port: int) -> int:
    """Requests the engine on `port` is running now."""
    return int(counter(await scrape(f"http://127.0.0.1:{port}/metrics"), "vllm:num_requests_running"))


def pid_on(port: int) -> int | None:
    try:
        return engine_pid(port)
    except AssertionError:
        return None


def not_active(state: ClusterState) -> list[str]:
    """Per role without an ACTIVE instance: what its instances are instead."""
    out = []
    for role in ROLES:
        if not _active(state, role):
            mine = [f"{i} {r.state.value}" for i, r in sorted(state.instances.items()) if r.spec.role == role]
            out.append(f"{role.value}: {', '.join(mine) or 'no instance'}")
    return out


async def probe(base_url: str, load: LoadGen | None, n: int = 8) -> None:
    """A burst of `n` concurrent requests (recorded with the load's outcomes when given)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=30)

    async def one(i: int) -> None:
        spec = SPECS[i % len(SPECS)]
        out = Outcome(spec.key, -2, spec.stream, time.time())
        await run_one(client, spec, out)
        if load is not None:
            load.outcomes.append(out)

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()
