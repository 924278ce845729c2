"""The chaos suite's cluster: `motor up`'s launcher, supervised, and what a scenario observes.

`ChaosCluster` runs one supervised local cluster (builtin engines, one union instance and a
1P1D pair, test-speed liveness, the production breaker and lease) and reads it from outside:
a fresh fold of what MOTOR holds (not the components' own followers: the log is the oracle),
raw log entries, engine processes and counters, controller leadership, process liveness. If a
scenario leaves it unhealed, `ensure_healthy` starts a fresh one so the next scenario is judged
on its own fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import openai
import orjson
from nats.aio.client import Client

from core.config import ClusterConfig, ControllerConfig
from core.coordconfig import BreakerConfig, CoordinatorConfig
from core.state import ClusterState
from deploy.cluster import NATS, LocalCluster
from deploy.watch import snapshot_state
from streams.connection import connect
from streams.definitions import MOTOR_STREAM
from streams.log import Range
from streams.reader import read_deliveries
from tests.chaos.fleet import converged, engines, not_active, probe, scrape, served
from tests.chaos.invariants import Entry, Proc
from tests.chaos.load import SPECS, LoadGen, Outcome, reference_texts, run_one
from tests.localcluster import Harness, cluster_config, running_cluster, tmpfs

log = logging.getLogger(__name__)

MOTOR = [sys.executable, "-m", "deploy.cli"]
FIRST_TOKEN_TIMEOUT = 5.0
INTER_TOKEN_TIMEOUT = 5.0


def chaos_config(max_age: float | None = None) -> ClusterConfig:
    """Test-speed liveness; the breaker and the leader lease as shipped (what users get);
    `max_age`: MOTOR keeps events this many seconds (the age-out scenario), else as shipped."""
    coordinator: dict[str, Any] = {
        "retries": 3,
        "first_token_timeout": FIRST_TOKEN_TIMEOUT,
        "breaker": BreakerConfig().model_dump(),
    }
    if "inter_token_timeout" in CoordinatorConfig.model_fields:  # configurable once it exists
        coordinator["inter_token_timeout"] = INTER_TOKEN_TIMEOUT
    # Test-speed health checks: a frozen engine is called ABNORMAL within ~2.3 s (two 1 s
    # probes), what the freeze scenarios' latency bound is made of.
    health = {"health_check_config": {"interval": 0.3, "timeout": 1.0, "retry_attempts": 2}}
    engine = {"engine_config": {"itl_ms": 15}, **health}
    # A prefill leg lasts a few ms at the default speed: a kill would almost never meet one.
    slow_prefill = {"engine_config": {"itl_ms": 15, "ttft_base_ms": 150}, **health}
    nats = {"nats": {"max_age_days": max_age / 86400}} if max_age is not None else {}
    return cluster_config(
        **nats,
        # Kills in these scenarios are independent faults, not a crash loop: an instance that
        # served 3 s since its last crash starts the restart ladder again.
        controller={"lease_ttl": ControllerConfig().lease_ttl, "restart_reset_after": 3.0},
        coordinator=coordinator,
        union=engine,
        prefill=slow_prefill,
        decode=engine,
    )


class ChaosCluster:
    """One supervised local cluster shared by scenarios, replaced when a scenario breaks it."""

    refs: dict[str, str] = {}  # reference texts: a property of the engines, not of one cluster

    def __init__(
        self, base: Path, *, coordinators: int = 2, max_age: float | None = None, disk: int | None = None
    ) -> None:
        self.base = base
        self.coordinators = coordinators
        self.max_age = max_age
        # The NATS store on a tmpfs of this many bytes (the disk-full scenario; root only), and
        # every process journaling its acks there beside it (`motor events acked`).
        self.disk = disk
        self.cfg = chaos_config(max_age)
        self._stack: AsyncExitStack | None = None
        self._h: Harness | None = None
        self._admin: Client | None = None
        self.generation = 0
        self.fold_error = ""  # why the last fold of the log failed

    @property
    def h(self) -> Harness:
        assert self._h is not None, "cluster not started"
        return self._h

    @property
    def admin(self) -> Client:
        """A connection as motor up's admin user: it may publish anything and change streams
        (the harness's own `h.nc` reads, as the inspect user)."""
        assert self._admin is not None, "cluster not started"
        return self._admin

    @property
    def cluster(self) -> LocalCluster:
        return self.h.cluster

    @property
    def base_url(self) -> str:
        return self.h.base_url

    client_timeout = 60.0  # the load's clients give a request this long

    async def start(self) -> None:
        """Start a fresh cluster and wait until it serves; record reference texts once."""
        self.generation += 1
        stack = AsyncExitStack()
        root = self.base / f"cluster-{self.generation}"
        env: dict[str, str] = {}
        if self.disk is not None:
            stack.enter_context(tmpfs(root / "nats", self.disk))  # unmounted after the cluster stopped
            env["MOTOR_ACK_JOURNAL"] = str(self.acks)
        self._h = await stack.enter_async_context(
            running_cluster(
                root,
                self.cfg,
                nodes=3,
                ready="one ACTIVE instance per role",
                ready_pred=converged,
                coordinators=self.coordinators,
                supervise=True,
                extra_env=env,
            )
        )
        self._admin = await connect(self._h.cluster.client_options("admin"), name="chaos-admin")
        stack.push_async_callback(self._admin.close)
        self._stack = stack
        await self.wait_serving(90)
        if not ChaosCluster.refs:
            ChaosCluster.refs = await reference_texts(self.base_url)

    @property
    def acks(self) -> Path:
        """Where the processes journal their acks (with `disk`)."""
        return self.base / f"cluster-{self.generation}" / "acks"

    async def ack_audit(self) -> tuple[dict[str, Any] | None, str]:
        """What `motor events acked --json` says of every process's acks."""
        out = await self.motor("events", "acked", str(self.acks), "--json")
        try:
            return orjson.loads(out.stdout), ""
        except orjson.JSONDecodeError:
            return None, (out.stderr or out.stdout).strip()[-300:]

    async def stop(self) -> None:
        if self._stack is not None:
            stack, self._stack, self._admin = self._stack, None, None
            await stack.aclose()

    async def ensure_healthy(self, within: float = 30.0) -> None:
        """Converged and serving (what the previous scenario left healed), or a fresh cluster."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            state = await self.fold()
            if state is not None and converged(state) and await self.one_request_ok():
                return
            await asyncio.sleep(0.5)
        print(f"\n-- the cluster did not heal within {within:g} s: starting a fresh one", flush=True)
        await self.stop()
        await self.start()

    async def wait_serving(self, within: float) -> None:
        deadline = time.monotonic() + within
        while not await self.one_request_ok():
            assert time.monotonic() < deadline, f"the coordinator did not serve within {within:g} s"
            await asyncio.sleep(0.3)

    async def one_request_ok(self) -> bool:
        spec = SPECS[1]
        out = Outcome(spec.key, -1, spec.stream, time.time())
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key="none", max_retries=0, timeout=10)
        try:
            await run_one(client, spec, out)
        finally:
            await client.close()
        return out.ok

    # ------------------------------------------------------------------ the log

    async def fold(self, limit: float = 15.0) -> ClusterState | None:
        """A fresh fold of what MOTOR (and MOTOR_HB) hold now; None while NATS does not answer."""
        try:
            async with asyncio.timeout(limit):
                state = await snapshot_state(self.h.nc)
        except Exception as exc:  # NATS away, stream missing, an event no fold can apply
            log.info("fold failed: %r", exc)
            self.fold_error = f"{type(exc).__name__}: {exc}"
            return None
        self.fold_error = ""
        return state

    async def entries(self, since_seq: int = 0) -> list[Entry]:
        """MOTOR's messages as stored (types this branch cannot decode included)."""
        out = []
        async with asyncio.timeout(30):
            async for d in read_deliveries(self.h.nc, MOTOR_STREAM, Range(start_seq=since_seq or None)):
                out.append(entry(d.seq, d.subject, d.data))
        return out

    async def last_seq(self) -> int:
        info = await self.h.nc.jetstream().stream_info(MOTOR_STREAM)
        return int(info.state.last_seq)

    async def motor(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The `motor` CLI against this cluster, as an operator runs it."""
        return await asyncio.to_thread(
            subprocess.run,
            # --root: the CLI logs in as motor up's inspect user, from the cluster's own files
            [*MOTOR, *args, "--nats-url", self.cluster.url, "--root", str(self.cluster.root)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "250"},  # rich wraps at 80 columns off a terminal
        )

    # ------------------------------------------------------------------ processes

    def snapshot_procs(self) -> dict[str, tuple[int | None, int]]:
        """name -> (pid, supervisor restarts so far)."""
        out: dict[str, tuple[int | None, int]] = {}
        for ch in self.cluster.children:
            alive = ch.proc is not None and ch.proc.poll() is None
            out[ch.name] = (
                ch.proc.pid if alive and ch.proc is not None else None,
                self.cluster.restarts(ch.name),
            )
        out[NATS] = (self.cluster.nats.pid, self.cluster.restarts(NATS))
        return out

    def procs_since(self, before: dict[str, tuple[int | None, int]]) -> dict[str, Proc]:
        now = self.snapshot_procs()
        return {
            name: Proc(
                alive=pid is not None,
                restarts=r - before.get(name, (None, 0))[1],
                pid_changed=pid != before.get(name, (None, 0))[0],
            )
            for name, (pid, r) in now.items()
        }

    def controller_ports(self) -> dict[str, int]:
        return {
            f"controller-c{i + 1}": self.cluster.ports.controller + i
            for i in range(len(self.cluster.controller_names()))
        }

    async def leader(self) -> str | None:
        """The child name of the controller whose /readiness says it leads."""
        for name, port in self.controller_ports().items():
            if await scrape(f"http://127.0.0.1:{port}/readiness", limit=2) is not None:
                return name
        return None

    async def leader_changed(self, since_seq: int, since: float, within: float) -> tuple[str, float] | None:
        """(leader id, ts) of the first `controller.leader_changed` after `since`, once in the log."""
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(Exception):  # NATS may still be coming back
                last = await self.last_seq()
                for e in await self.entries(since_seq + 1 if 0 < since_seq <= last else 0):
                    if e.type == "controller.leader_changed" and e.ts >= since:
                        return str(e.data.get("leader_id")), e.ts
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.2)

    async def controller_seq(self, name: str) -> int:
        body = await scrape(f"http://127.0.0.1:{self.controller_ports()[name]}/debug/state")
        return int(orjson.loads(body)["last_seq"]) if body else -1

    # ------------------------------------------------------------------ routing

    async def wait_until(
        self, what: str, pred: Callable[[ClusterState], bool], within: float
    ) -> ClusterState:
        deadline = time.monotonic() + within
        while True:
            state = await self.fold()
            if state is not None and pred(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within:g} s waiting for {what}")
            await asyncio.sleep(0.3)

    async def routes_to_all(self, load: LoadGen | None, within: float) -> tuple[bool, list[str]]:
        """Whether requests reach every engine of every ACTIVE instance (counters move) in time."""
        deadline = time.monotonic() + within
        missing: list[str] = []
        while time.monotonic() < deadline:
            state = await self.fold()
            if state is None or not converged(state):
                missing = ["(not every instance ACTIVE)"]
                await asyncio.sleep(0.3)
                continue
            eps = engines(state)
            before = {e: await served(e.port) for e in eps}
            await probe(self.base_url, load)
            after = {e: await served(e.port) for e in eps}
            missing = [e.label for e in eps if after[e] <= before[e]]
            if not missing:
                return True, []
        return False, missing

    async def converge(self, since: float, within: float, load: LoadGen | None) -> tuple[float | None, str]:
        """(seconds from `since` until every instance is ACTIVE and served, or None; what was missing)."""
        try:
            await self.wait_until("every instance ACTIVE", converged, within)
        except AssertionError:
            state = await self.fold()
            if state is None:
                return None, f"a fold of the log fails ({self.fold_error})"
            return None, "; ".join(not_active(state)) or "not every role has an ACTIVE instance"
        ok, missing = await self.routes_to_all(load, max(1.0, since + within - time.time()))
        if not ok:
            return None, "no request reached " + ", ".join(missing)
        return time.time() - since, ""


def entry(seq: int, subject: str, raw: bytes) -> Entry:
    """One MOTOR message as stored, read without the codec (unknown types included)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Entry(seq, subject, "<undecodable>", 0.0)
    if not isinstance(body, dict):
        return Entry(seq, subject, "<undecodable>", 0.0)
    data = body.get("data")
    ts = body.get("ts")
    caused = body.get("caused_by")
    return Entry(
        seq,
        subject,
        str(body.get("type", "<untyped>")),
        float(ts) if isinstance(ts, int | float) else 0.0,
        data if isinstance(data, dict) else {},
        caused.get("id") if isinstance(caused, dict) else None,
        str(body.get("source", "")),
    )
