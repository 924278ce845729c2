"""A `motor up`-style cluster for whole-cluster tests: real processes on free ports.

The e2e suite, the chaos suite (`tests/chaos`) and the real-engine suite start their clusters
through `running_cluster`: the same `LocalCluster` launcher as `motor up`, test-speed timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core.config import ClusterConfig, config_from_dict
from core.events import InstanceState, Role
from core.state import ClusterState
from deploy.cluster import Child, LocalCluster
from deploy.clusterplan import NATS_MONITOR_OFFSET, NATS_ROUTE_OFFSET, Ports
from deploy.watch import StateWatcher


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n_nodes: int, nats_servers: int = 1) -> Ports:
    """A block of ports no one listens on: NATS, coordinator, controllers, agents, engines.

    NATS member i of a cluster listens on base+i, its routes on base+2000+i and its monitoring
    on base+4000+i (`motor up --nats-port`'s layout; deploy.natscluster: each NATS port + i).
    """
    for _ in range(200):
        # Below Linux's ephemeral range (32768-60999): a port picked there can be taken by any
        # process's outgoing connection or a vLLM engine's internal socket before our process
        # binds it (test-vllm: the coordinator's port, 'address already in use').
        # Steps of 500, not 1000: agents sharing the machine hold the round bases' ports (bench kv
        # found every one of the 18 busy at once); a block spans base..base+300 plus NATS's +2000/+4000.
        base = random.randrange(10000, 28000, 500)
        nats = [
            base + off + i for off in (0, NATS_ROUTE_OFFSET, NATS_MONITOR_OFFSET) for i in range(nats_servers)
        ]
        candidates = [base + 60 + i for i in range(10)] + [base + 100 + i for i in range(n_nodes)]
        engines = [base + 200 + i * 10 + j for i in range(n_nodes) for j in range(3)]
        if all(_free(p) for p in nats + candidates + engines):
            return Ports(
                nats=base,
                nats_monitor=base + NATS_MONITOR_OFFSET,
                nats_route=base + NATS_ROUTE_OFFSET,
                coordinator=base + 60,
                controller=base + 61,  # and base + 62 for the standby
                nodeagent=base + 100,
                engine=base + 200,
                engine_stride=10,
            )
    raise RuntimeError("no free port block found")


def cluster_config(**overrides: Any) -> ClusterConfig:
    """The default cluster (one union instance, one 1P1D pair) with test-speed timeouts."""
    raw: dict[str, Any] = {
        "controller": {
            "heartbeat_timeout": 4.0,
            "terminate_after": 30.0,
            "start_timeout": 20.0,
            "lease_ttl": 3.0,
            "tick_interval": 0.2,
            "recovery_timeout": 60.0,
        },
        "nodeagent": {"heartbeat_interval": 0.5},
        "union": {"instances": 1, "engine_type": "builtin", "health_check_config": {"interval": 0.3}},
        "prefill": {
            "instances": 1,
            "engine_type": "builtin",
            "dispatch_profile": "handoff",
            "health_check_config": {"interval": 0.3},
        },
        "decode": {
            "instances": 1,
            "engine_type": "builtin",
            "dispatch_profile": "handoff",
            "health_check_config": {"interval": 0.3},
        },
        "coordinator": {"retries": 3, "breaker": {"failures": 2, "backoff_initial": 2.0, "backoff_max": 5.0}},
    }
    return config_from_dict(merged(raw, overrides), "<e2e>")


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top, nested dicts merged key by key."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(value, dict) and isinstance(old, dict) else value
    return out


class Harness:
    """The running cluster plus a live fold of its log."""

    def __init__(self, cluster: LocalCluster, nc: Any) -> None:
        self.cluster = cluster
        self.nc = nc
        self.log: list[Any] = []  # every MOTOR record folded so far
        self.watcher = StateWatcher(nc, on_event=self.log.append)

    def seen(self, etype: str, **match: Any) -> bool:
        """Whether the log holds an event of `etype` whose data has the `match` values."""
        return any(
            r.event.type == etype and all(getattr(r.event.data, k) == v for k, v in match.items())
            for r in self.log
        )

    @property
    def state(self) -> ClusterState:
        return self.watcher.state

    @property
    def base_url(self) -> str:
        return self.cluster.coordinator_url + "/v1"

    async def wait_for(self, what: str, pred: Callable[[ClusterState], bool], within: float = 60.0) -> None:
        """Poll the folded state until `pred` holds; fail naming `what` and the logs."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if pred(self.state):
                return
            dead = self.cluster.exited()
            if dead:
                names = ", ".join(f"{c.name} (exit {c.proc.returncode if c.proc else '?'})" for c in dead)
                raise AssertionError(f"while waiting for {what}: {names} exited; logs in {self.cluster.logs}")
            await asyncio.sleep(0.1)
        tail = [(r.seq, r.event.type) for r in self.log[-8:]]
        raise AssertionError(
            f"timed out after {within}s waiting for {what}; folded up to seq {self.state.last_seq} "
            f"(watcher {self.watcher.health()}), last events {tail}; logs in {self.cluster.logs}"
        )

    def instance_of(self, role: Role) -> int:
        ids = [i for i, rec in self.state.instances.items() if rec.spec.role == role]
        assert ids, f"no {role} instance"
        return min(ids)

    def active(self, iid: int) -> bool:
        rec = self.state.instances.get(iid)
        return rec is not None and rec.state == InstanceState.ACTIVE

    def engine_port(self, iid: int) -> int:
        rec = self.state.instances[iid]
        node = self.state.nodes[rec.spec.members[0].node_id]
        return node.reg.endpoints[0].business_port


def engine_pid(port: int, word: bytes = b"simengine") -> int:
    """The pid of the process serving `port` whose command line holds `word` (found in /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if word in argv and b"--port" in argv:
            i = argv.index(b"--port")
            if i + 1 < len(argv) and argv[i + 1] == str(port).encode():
                return int(entry.name)
    raise AssertionError(f"no {word.decode()} process on port {port}")


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` (a small disk), unmounted after; skips the test
    without root, which `mount` needs (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills) needs root; CI runs as root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def kill_child(cluster: LocalCluster, name: str, sig: int = signal.SIGKILL) -> None:
    """Signal the process group of one of the cluster's processes, if it runs (a test's fault)."""
    c = cluster.child(name)
    if c.proc is not None and c.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(c.proc.pid, sig)


def restart_child(
    cluster: LocalCluster,
    name: str,
    *,
    set_args: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> Child:
    """Start one of the cluster's processes again, optionally with some flags changed
    (`{"--ip": "127.0.0.2"}`) and `env` added to its environment."""
    c = cluster.child(name)
    cluster.children.remove(c)
    argv = list(c.argv)
    for flag, value in (set_args or {}).items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return cluster.spawn(name, argv, env)


@contextlib.asynccontextmanager
async def running_cluster(
    root: Path,
    cfg: ClusterConfig,
    *,
    nodes: int,
    ready: str,
    ready_pred: Callable[[ClusterState], bool],
    coordinators: int = 1,
    supervise: bool = False,
    nats_cluster: int = 1,
    standby: bool = True,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[Harness]:
    """Start a local cluster, follow its log, wait until `ready_pred`; stop it all after.

    `supervise=False` (the e2e default) leaves a crashed process down, so a crash fails the
    test at once; the chaos suite supervises, as `motor up` does.
    """
    from streams.connection import connect

    cluster = LocalCluster(
        cfg,
        root=root,
        ports=free_ports(nodes, nats_servers=nats_cluster),
        nodes=nodes,
        coordinators=coordinators,
        supervise=supervise,
        nats_cluster=nats_cluster,
        standby=standby,
        extra_env={"PYTHONPATH": os.getcwd(), **(extra_env or {})},
    )
    await cluster.start()
    nc = await connect(cluster.client_options("inspect"), name="e2e")
    h = Harness(cluster, nc)
    await h.watcher.start()
    try:
        await h.wait_for(ready, ready_pred, within=90)
        yield h
    finally:
        await h.watcher.stop()
        await nc.close()
        await cluster.stop()
    # Every component logged in as its role: anything it was refused means a permission set
    # (streams.permissions) is missing what that role truly does. (Tests try the CLI's users
    # on forbidden things on purpose.)
    nats_log = [
        line
        for path in sorted(cluster.logs.glob("nats-*.log"))
        for line in path.read_text(errors="replace").splitlines()
    ]
    components = ('user:controller"', 'user:coordinator"', "user:nodeagent-")
    refused = [line for line in nats_log if "Violation" in line and any(c in line for c in components)]
    assert not refused, "\n".join(refused[:20])
