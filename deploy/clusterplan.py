"""What `motor up` runs, worked out before anything starts: ports, node agents, replicas.

Pure: the launcher (`deploy.cluster`) asks these and starts what they say.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import ClusterConfig
from core.events import Role

MAX_REPLICAS = 5  # JetStream's limit on a stream's replicas
# NATS's own conventions (4222 clients, 6222 routes, 8222 monitoring), kept for another base.
NATS_ROUTE_OFFSET = 2000
NATS_MONITOR_OFFSET = 4000


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
