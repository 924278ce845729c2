"""`just bench fleet`: N simulated node agents assembled by one controller and one coordinator.

A cold start: an empty log, a real `motor controller` (leader) and `motor coordinator`, each its
own process, and `--fleet-procs` processes of `tests.fleetsim` holding the N node agents, each
a NATS connection of its own with a durable command consumer, registering, heartbeating every
`nodeagent.heartbeat_interval` and answering start commands (no engine processes: an endpoint
goes STARTING then READY at once). The config (`fleet_config`) is half union instances, half
1P1D pairs, one node an instance, on Motor's default timings. The clock starts once every fleet
process has its interpreter up and is told to go.

Measured: when every instance is ACTIVE in the log (the stream's timestamp of the last
`instance.state_changed`, as the bench's own fold of MOTOR sees it) and when the coordinator
routes every endpoint; the controller's CPU in cores (utime + stime from /proc over the window)
during assembly and during a window of steady heartbeats, and its CPU per decision (the events
it appended in the window, counted in the log); the coordinator's fold lag p99 from
`motor_coordinator_fold_lag_seconds` (append to fold; the bucket bound is reported) for MOTOR
events during assembly and for heartbeats in the steady window. Every process's CPU is printed.

JetStream runs with the server's lazy fsync by default, as `just bench controller` does: with
Motor's `sync_interval: always` every message is an fsync, and this machine's disk (about 700 a
second) rather than Motor sets the pace (`--fsync always` measures that).
Last line: `BENCH fleet nodes=... assemble_s=... controller_cpu_cores=... coordinator_lag_ms_p99=... ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from core.config import ClusterConfig, config_from_dict
from core.events import InstanceAssembled, InstanceState, InstanceStateChanged, NodeRegistered
from core.reducer import apply
from core.state import ClusterState
from streams.jetstream import JetStreamLog
from streams.reader import Record
from tests.bench import _measure as m
from tests.bench._procs import Proc, free_port, raise_fd_limit, readline, spawn, until
from tests.fleetsim import fleet_plan

LAZY_FSYNC = 'jetstream {{\n  store_dir: "{}"\n  sync_interval: "2m"\n}}'
LAG = "motor_coordinator_fold_lag_seconds"


def fleet_config(nodes: int) -> dict[str, Any]:
    """Half the nodes union instances, the other half 1P1D pairs; every instance one node."""
    pd = nodes // 4
    sec = {"engine_type": "builtin", "model": "motor-sim"}
    cfg: dict[str, Any] = {"name": "motor-bench-fleet", "union": {**sec, "instances": nodes - 2 * pd}}
    if pd:
        for role in ("prefill", "decode"):
            cfg[role] = {**sec, "instances": pd, "dispatch_profile": "handoff"}
    return cfg


class LogWatch:
    """The bench's own fold of MOTOR: what is registered, assembled and ACTIVE, and since when."""

    def __init__(self, nodes: int, instances: int) -> None:
        self.nodes, self.instances = nodes, instances
        self.state = ClusterState()
        self.active: set[int] = set()
        self.decisions = 0  # events appended by a controller
        self.registered_at: float | None = None  # stream timestamps (epoch seconds)
        self.active_at: float | None = None
        self.all_active = asyncio.Event()

    def apply(self, rec: Record) -> None:
        """Fold one MOTOR record (a LiveFold callback)."""
        ev = rec.event
        self.state = apply(self.state, ev, rec.seq)
        if ev.source.startswith("controller/"):
            self.decisions += 1
        if isinstance(ev, NodeRegistered) and self.registered_at is None:
            if len(self.state.nodes) >= self.nodes:
                self.registered_at = rec.appended
        elif isinstance(ev, InstanceStateChanged | InstanceAssembled):
            iid = ev.data.instance_id
            inst = self.state.instances.get(iid)
            if inst is not None and inst.state == InstanceState.ACTIVE:
                self.active.add(iid)
            else:
                self.active.discard(iid)
            if len(self.active) >= self.instances and self.active_at is None:
                self.active_at = rec.appended
                self.all_active.set()

    def progress(self) -> str:
        """One line of where assembly stands."""
        starts = sum(1 for n in self.state.nodes.values() if n.start_cmd is not None)
        return (
            f"registered {len(self.state.nodes)}/{self.nodes}  assembled {len(self.state.instances)}/"
            f"{self.instances}  started {starts}  active {len(self.active)}/{self.instances}"
        )


async def _metrics(http: aiohttp.ClientSession, p: Proc) -> str:
    async with http.get(f"{p.url}/metrics") as r:
        return await r.text()


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: m.cpu_seconds(pid) for name, pid in pids.items()}


def _cores(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    return {name: round((after[name] - before[name]) / wall, 3) for name in before}


def _lag(after: str, before: str, stream: str) -> m.Buckets:
    return m.delta(m.histogram(after, LAG, {"stream": stream}), m.histogram(before, LAG, {"stream": stream}))


class Bench:
    """One run: NATS, the controller, the coordinator and the fleet, and what was measured."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.raw = fleet_config(args.nodes)
        self.cfg: ClusterConfig = config_from_dict(self.raw)
        self.plan = fleet_plan(self.cfg)
        secs = self.cfg.sections().values()
        self.instances = sum(sec.instances for sec in secs)
        self.endpoints = sum(s.instances * s.nodes_per_instance() * s.endpoints_per_node() for s in secs)
        self.cfg_path = tmp / "fleet.json"
        self.cfg_path.write_bytes(orjson.dumps(self.raw))
        self.watch = LogWatch(len(self.plan), self.instances)
        self.procs: list[Proc] = []
        self.out: dict[str, Any] = {"nodes": len(self.plan), "instances": self.instances, "fsync": args.fsync}

    def check(self) -> None:
        """Raise if any process the bench started has exited."""
        for p in self.procs:
            p.check()

    async def run(self) -> dict[str, Any]:
        """Start everything, measure assembly and a steady window, stop everything."""
        from streams.connection import connect
        from streams.definitions import ensure_streams
        from streams.livefold import LiveFold
        from streams.server import EmbeddedNats

        union = self.cfg.union.instances if self.cfg.union else 0
        pairs = self.cfg.prefill.instances if self.cfg.prefill else 0
        files = raise_fd_limit(4 * len(self.plan) + 1024)
        print(f"fleet: {len(self.plan)} nodes in {self.args.fleet_procs} process(es); {self.instances} instances "
              f"({union} union, {pairs} 1P1D pairs); fsync {self.args.fsync}; open files {files}", flush=True)  # fmt: skip
        store = self.tmp / "nats"
        extra = LAZY_FSYNC.format((store / "js").resolve()) if self.args.fsync == "lazy" else ""
        nats = EmbeddedNats(store, log_file=self.tmp / "nats.log", extra_conf=extra)
        await nats.start()
        nc = await connect(nats.url, name="bench-fleet")
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        fold = LiveFold(JetStreamLog(nc), self.watch.apply, name="bench-fleet")
        try:
            await ensure_streams(nc.jetstream(), self.cfg.nats, lease_ttl=self.cfg.controller.lease_ttl)
            await fold.start()
            ctl, coord = await self.start_control_plane(nats.url, http)
            fleet = await self.start_fleet(nats.url)
            pids = {"controller": ctl.proc.pid, "coordinator": coord.proc.pid, "nats": nats.pid or 0}
            pids.update({f.name: f.proc.pid for f in fleet})
            pids["bench"] = os.getpid()
            await self.assemble(http, ctl, coord, fleet, pids)
            await self.routable(http, coord)
            await self.steady(http, ctl, coord, pids)
            return self.out
        finally:
            for p in reversed(self.procs):
                p.stop(60)  # a fleet process closes hundreds of connections
            await fold.close()
            await http.close()
            await nc.close()
            await nats.stop()

    async def start_control_plane(self, url: str, http: aiohttp.ClientSession) -> tuple[Proc, Proc]:
        """A controller and a coordinator, up: the controller leads, the coordinator caught up."""
        py = [sys.executable, "-m", "deploy.cli"]
        common = ["--config", str(self.cfg_path), "--nats-url", url, "--log-level", "WARNING"]
        ports = free_port(), free_port()
        ctl = spawn(
            "controller", [*py, "controller", *common, "--port", str(ports[0])], self.tmp, port=ports[0]
        )
        coord = spawn("coordinator", [*py, "coordinator", *common, "--port", str(ports[1])], self.tmp, port=ports[1])  # fmt: skip
        self.procs += [ctl, coord]

        async def up() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                c, k = await _metrics(http, ctl), await _metrics(http, coord)
                return m.sample(c, "motor_controller_is_leader") == 1 and m.sample(k, "motor_coordinator_caught_up") == 1  # fmt: skip
            return False

        await until("the controller leading and the coordinator caught up", up, self.procs, 60)
        return ctl, coord

    async def start_fleet(self, url: str) -> list[Proc]:
        """The fleet processes, each with its interpreter up and waiting for the word to go."""
        n = len(self.plan)
        per = -(-n // self.args.fleet_procs)
        fleet: list[Proc] = []
        for k, first in enumerate(range(0, n, per)):
            argv = [sys.executable, "-m", "tests.fleetsim", "--nats-url", url, "--config", str(self.cfg_path),
                    "--first", str(first), "--count", str(min(per, n - first)), "--wait-go"]  # fmt: skip
            fleet.append(spawn(f"fleet-{k}", argv, self.tmp, piped=True))
        self.procs += fleet
        loop = asyncio.get_running_loop()
        for f in fleet:
            line = await loop.run_in_executor(None, readline, f)
            if not line.startswith("ready"):
                f.check()
                raise RuntimeError(f"{f.name} said {line!r}, not 'ready N'")
        return fleet

    async def assemble(
        self, http: aiohttp.ClientSession, ctl: Proc, coord: Proc, fleet: list[Proc], pids: dict[str, int]
    ) -> None:
        """Go: wait until every instance is ACTIVE, printing progress every second."""
        w, o = self.watch, self.out
        cpu0, coord0 = _cpu(pids), await _metrics(http, coord)
        decisions0 = w.decisions
        t0, wall0 = time.monotonic(), time.time()
        for f in fleet:
            assert f.proc.stdin is not None
            f.proc.stdin.write(b"go\n")
            f.proc.stdin.flush()
        while not w.all_active.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.all_active.wait(), 1.0)
            elapsed = time.monotonic() - t0
            if not w.all_active.is_set():
                busy = (m.cpu_seconds(pids["controller"]) - cpu0["controller"]) / elapsed
                print(f"{elapsed:6.1f}s  {w.progress()}  controller {busy:.2f} cores", flush=True)
            self.check()
            if elapsed > self.args.timeout:
                raise TimeoutError(
                    f"not every instance ACTIVE within {self.args.timeout:g} s: {w.progress()}"
                )
        cpu1 = _cpu(pids)
        cores = _cores(cpu0, cpu1, time.monotonic() - t0)
        coord1 = await _metrics(http, coord)
        assert w.active_at is not None and w.registered_at is not None
        o["assemble_s"] = round(w.active_at - wall0, 2)
        o["registered_s"] = round(w.registered_at - wall0, 2)
        o["decisions"] = w.decisions - decisions0
        o["controller_cpu_cores"] = cores["controller"]
        o["coordinator_cpu_cores"] = cores["coordinator"]
        spent = cpu1["controller"] - cpu0["controller"]
        o["controller_cpu_ms_per_decision"] = round(spent * 1000 / max(1, o["decisions"]), 3)
        lag = _lag(coord1, coord0, "MOTOR")
        o["coordinator_lag_ms_p99"] = m.p99_ms(lag)
        print(f"{o['assemble_s']:6.1f}s  {w.progress()}: every instance ACTIVE ({o['decisions']} decisions; "
              f"all {len(self.plan)} registered at {o['registered_s']} s)", flush=True)  # fmt: skip
        print(f"        CPU cores during assembly: {_listing(cores)}; coordinator fold lag p99 <= "
              f"{o['coordinator_lag_ms_p99']} ms over {m.count(lag)} events", flush=True)  # fmt: skip

    async def routable(self, http: aiohttp.ClientSession, coord: Proc) -> None:
        """Wait until the coordinator routes every endpoint (polled every 0.2 s)."""
        seen = 0.0

        async def all_routable() -> bool:
            nonlocal seen
            seen = m.samples_sum(await _metrics(http, coord), "motor_coordinator_routable_endpoints")
            return seen >= self.endpoints

        await until(f"the coordinator routing all {self.endpoints} endpoints", all_routable, self.procs, 60)
        print(f"        the coordinator routes {int(seen)}/{self.endpoints} endpoints", flush=True)

    async def steady(self, http: aiohttp.ClientSession, ctl: Proc, coord: Proc, pids: dict[str, int]) -> None:
        """A window of heartbeats from an assembled fleet: CPU, heartbeat lag, and no decisions."""
        c0, k0, cpu0 = await _metrics(http, ctl), await _metrics(http, coord), _cpu(pids)
        t0, d0 = time.monotonic(), self.watch.decisions
        while (elapsed := time.monotonic() - t0) < self.args.steady_seconds:
            await asyncio.sleep(min(1.0, self.args.steady_seconds - elapsed))
            self.check()
        wall = time.monotonic() - t0
        cores = _cores(cpu0, _cpu(pids), wall)
        c1, k1 = await _metrics(http, ctl), await _metrics(http, coord)
        o = self.out
        o["controller_steady_cores"] = cores["controller"]
        o["coordinator_steady_cores"] = cores["coordinator"]
        o["steady_decisions"] = self.watch.decisions - d0
        hb = _lag(k1, k0, "MOTOR_HB")
        o["coordinator_hb_lag_ms_p99"] = m.p99_ms(hb)
        o["hb_rate"] = round(m.count(hb) / wall)
        name = "motor_controller_heartbeat_lag_seconds"
        o["controller_hb_lag_ms_p99"] = m.p99_ms(m.delta(m.histogram(c1, name), m.histogram(c0, name)))
        print(f"steady {wall:.0f} s: {o['hb_rate']} heartbeats/s folded by the coordinator, "
              f"{o['steady_decisions']} decisions; heartbeat lag p99 <= {o['controller_hb_lag_ms_p99']} ms "
              f"(controller), <= {o['coordinator_hb_lag_ms_p99']} ms (coordinator)", flush=True)  # fmt: skip
        print(f"        CPU cores: {_listing(cores)}", flush=True)


def _listing(cores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value}" for name, value in cores.items())


KEYS = (
    "nodes", "assemble_s", "controller_cpu_cores", "controller_cpu_ms_per_decision", "coordinator_lag_ms_p99",
    "controller_steady_cores", "coordinator_steady_cores", "coordinator_hb_lag_ms_p99", "controller_hb_lag_ms_p99",
    "registered_s", "decisions", "steady_decisions", "coordinator_cpu_cores", "instances", "hb_rate", "fsync",
)  # fmt: skip


def main(argv: list[str]) -> int:
    """Run the benchmark; the last line printed is `BENCH fleet ...`."""
    p = argparse.ArgumentParser(
        prog="just bench fleet", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--nodes", type=int, default=1000, help="simulated node agents (default 1000)")
    p.add_argument("--fleet-procs", type=int, default=2, help="processes the fleet runs in (default 2)")
    p.add_argument("--steady-seconds", type=float, default=10.0, help="length of the steady heartbeat window")
    p.add_argument("--timeout", type=float, default=300.0, help="give up when assembly takes longer (s)")
    p.add_argument("--fsync", choices=("lazy", "always"), default="lazy",
                   help="JetStream's sync_interval: the server's lazy default, or Motor's `always`")  # fmt: skip
    args = p.parse_args(argv)
    if args.nodes < 1:
        p.error(f"--nodes must be >= 1, got {args.nodes}")
    if args.fleet_procs < 1:
        p.error(f"--fleet-procs must be >= 1, got {args.fleet_procs}")
    if args.steady_seconds <= 0 or args.timeout <= 0:
        p.error("--steady-seconds and --timeout must be > 0")
    tmp = Path(tempfile.mkdtemp(prefix="motor-bench-fleet-"))
    try:
        out = asyncio.run(Bench(args, tmp).run())
    except (RuntimeError, TimeoutError) as exc:
        print(f"bench fleet failed: {exc}\nlogs kept in {tmp}", file=sys.stderr)
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    met = out["assemble_s"] < 30 and out["controller_cpu_cores"] < 1
    print(f"target (assembled < 30 s, controller < 1 core): {'met' if met else 'MISSED'}")
    print("BENCH fleet " + " ".join(f"{k}={out[k]}" for k in KEYS if k in out))
    return 0
