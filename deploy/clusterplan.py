"""What `motor up` runs, worked out before anything starts: ports, node agents, replicas.

Pure: the launcher (`deploy.cluster`) asks these (the node agents, each process's command
line) and starts what they say.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from core.config import ClusterConfig
from core.events import Role

MAX_REPLICAS = 5  # JetStream's limit on a stream's replicas
# NATS's own conventions (4222 clients, 6222 routes, 8222 monitoring), kept for another base.
NATS_ROUTE_OFFSET = 2000
NATS_MONITOR_OFFSET = 4000
# Every process `motor up` starts is a `motor` subcommand of this interpreter.
MOTOR = [sys.executable, "-m", "deploy.cli"]


@dataclass(frozen=True)
class Ports:
    nats: int = 4222  # member i of a NATS cluster: each NATS port + i
    nats_monitor: int = 4222 + NATS_MONITOR_OFFSET
    nats_route: int = 4222 + NATS_ROUTE_OFFSET
    coordinator: int = 8000
    controller: int = 8100
    nodeagent: int = 8200
    engine: int = 9000
    engine_stride: int = 100  # engine ports of node i: engine + i * stride, one per DP rank


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    role: Role
    port: int
    engine_port_base: int


def plan_nodes(cfg: ClusterConfig, nodes: int | None, ports: Ports) -> list[NodePlan]:
    """One node agent per node of every instance the config asks for (or `nodes` of them)."""
    wanted: list[Role] = []
    for role, sec in cfg.sections().items():
        wanted += [role] * (sec.instances * sec.nodes_per_instance())
    if nodes is not None:
        if nodes < len(wanted):
            wanted = wanted[:nodes]
        else:
            # Spare nodes take the role of the first section: they replace failed nodes.
            wanted += [wanted[0] if wanted else Role.UNION] * (nodes - len(wanted))
    plans = []
    counters: dict[Role, int] = {}
    for i, role in enumerate(wanted):
        k = counters.get(role, 0)
        counters[role] = k + 1
        plans.append(
            NodePlan(
                node_id=f"{role.value}-{k}",
                role=role,
                port=ports.nodeagent + i,
                engine_port_base=ports.engine + i * ports.engine_stride,
            )
        )
    return plans


def fit_replicas(cfg: ClusterConfig, servers: int, *, external: bool) -> ClusterConfig:
    """The config with `nats.replicas` fit for `servers` embedded servers: as many (at most
    JetStream's 5) when the file left it unset; more than there are servers is refused."""
    if external:
        return cfg
    nats = cfg.nats
    if "replicas" in nats.model_fields_set:
        if nats.replicas > servers:
            raise ValueError(
                f"nats.replicas is {nats.replicas} but only {servers} nats-server "
                f"{'runs' if servers == 1 else 'run'}: use --nats-cluster {nats.replicas} "
                "or lower nats.replicas"
            )
        return cfg
    want = min(servers, MAX_REPLICAS)
    if want == nats.replicas:
        return cfg
    return cfg.model_copy(update={"nats": nats.model_copy(update={"replicas": want})})


# The command line of each process; `common` is what every one is given (`--config`, `--nats-url`).


def controller_argv(common: list[str], cid: str, host: str, port: int) -> list[str]:
    """A controller, `cid` (`c1`, the standby `c2`), its probes on `host:port`."""
    return [*MOTOR, "controller", *common, "--id", cid, "--host", host, "--port", str(port)]


def coordinator_argv(
    common: list[str], name: str, host: str, port: int, probe_socket: Path, reuse_port: bool
) -> list[str]:
    """A coordinator replica on `host:port` (shared with `SO_REUSEPORT` by replicas), answering
    its liveness probe on `probe_socket`."""
    argv = [*MOTOR, "coordinator", *common, "--host", host, "--port", str(port), "--name", name]
    argv += ["--probe-socket", str(probe_socket)]
    return [*argv, "--reuse-port"] if reuse_port else argv


def nodeagent_argv(common: list[str], plan: NodePlan, ip: str, log_dir: Path) -> list[str]:
    """The node agent of `plan`'s node, reachable at `ip`, its engines' logs under `log_dir`."""
    return [
        *MOTOR,
        "nodeagent",
        *common,
        "--node-id",
        plan.node_id,
        "--role",
        plan.role.value,
        "--ip",
        ip,
        "--port",
        str(plan.port),
        "--engine-port-base",
        str(plan.engine_port_base),
        "--log-dir",
        str(log_dir),
    ]
