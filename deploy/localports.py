"""Ports for `motor up`, which runs every component on one machine.

A MindIE-Motor file gives each component its own pod, so its ports may coincide
(`controller_api_port`, `coordinator_api_mgmt_port` and `node_manager_port` are all 1026 in
its defaults). Here they cannot: the coordinator keeps its ports (clients call them), and a
later component whose ports overlap earlier ones moves to Motor's default, said in a note.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.config import ClusterConfig, ControllerConfig, NodeAgentConfig

NATS_PORTS = (4222, 8222)
ENGINE_STRIDE = 100  # deploy.cluster.Ports.engine_stride


def one_machine_ports(
    cfg: ClusterConfig, nodes: int, standby: bool = True, nats_ports: Iterable[int] = NATS_PORTS
) -> tuple[ClusterConfig, list[str]]:
    """`cfg` with overlapping ports moved to Motor's defaults, and a note per move."""
    taken: set[int] = set(nats_ports)
    notes: list[str] = []
    co = cfg.coordinator
    taken.add(co.port)
    mgmt = co.mgmt_port
    if mgmt is not None:
        if mgmt in taken:
            notes.append(f"coordinator.mgmt_port {mgmt} is taken here: management API on the main port")
            co = co.model_copy(update={"mgmt_port": None})
        else:
            taken.add(mgmt)

    def place(what: str, current: int, default: int, span: int) -> int:
        for port in (current, default):
            wanted = set(range(port, port + span))
            if not wanted & taken:
                taken.update(wanted)
                if port != current:
                    notes.append(f"{what} {current} overlaps another component's ports here: using {port}")
                return port
        raise ValueError(
            f"{what}: neither {current} nor Motor's default {default} is free of other components"
        )

    ctl = cfg.controller
    ctl_port = place("controller.port", ctl.port, ControllerConfig().port, 2 if standby else 1)
    na = cfg.nodeagent
    default_na = NodeAgentConfig()
    agent_port = place("nodeagent.port_base", na.port_base, default_na.port_base, max(nodes, 1))
    engine_port = place(
        "nodeagent.engine_port_base",
        na.engine_port_base,
        default_na.engine_port_base,
        max(nodes, 1) * ENGINE_STRIDE,
    )
    out = cfg.model_copy(
        update={
            "coordinator": co,
            "controller": ctl.model_copy(update={"port": ctl_port}),
            "nodeagent": na.model_copy(update={"port_base": agent_port, "engine_port_base": engine_port}),
        }
    )
    return out, notes
