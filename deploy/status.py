"""The cluster status table shared by `motor up` (live) and `motor status` (once)."""

from __future__ import annotations

from rich.table import Table

from core.events import EndpointStatus, InstanceState
from core.state import ClusterState
from streams.placement import StreamPlacement

STATE_STYLE = {
    InstanceState.ACTIVE: "green",
    InstanceState.INITIAL: "cyan",
    InstanceState.INACTIVE: "yellow",
    InstanceState.DEGRADED: "yellow",
    InstanceState.ISOLATED: "red",
    InstanceState.RECOVERING: "blue",
    InstanceState.TERMINATED: "dim",
}
EP_STYLE = {
    EndpointStatus.READY: "green",
    EndpointStatus.STARTING: "cyan",
    EndpointStatus.ABNORMAL: "yellow",
    EndpointStatus.DEAD: "red",
    EndpointStatus.STOPPED: "dim",
}


def _age(now: float, ts: float | None) -> str:
    if ts is None:
        return "never"
    return f"{max(0.0, now - ts):.0f}s ago"


def status_table(state: ClusterState, now: float, placement: StreamPlacement | None = None) -> Table:
    """Instances with roles, states, endpoints and load; then nodes not in any instance; with
    `placement`, which nats-server leads the MOTOR stream."""
    table = Table(title="Motor cluster", expand=False)
    for col in ("instance", "role", "engine", "state", "endpoints", "load (run/wait)", "last heartbeat"):
        table.add_column(col)
    for iid, inst in sorted(state.instances.items()):
        eps: list[str] = []
        running = waiting = 0
        last_hb: float | None = None
        for member in inst.spec.members:
            node = state.nodes.get(member.node_id)
            for ep in member.endpoints:
                status = node.endpoint_status.get(ep.id) if node else None
                ip = node.reg.pod_ip if node else ep.ip
                style = EP_STYLE.get(status, "dim") if status else "dim"
                eps.append(f"[{style}]{member.node_id} {ip}:{ep.business_port} {status or '?'}[/]")
            if node is not None:
                for load in node.load:
                    running += load.running
                    waiting += load.waiting
                if node.last_hb_ts is not None:
                    last_hb = max(last_hb or 0.0, node.last_hb_ts)
        st = inst.state
        notes = []
        if iid in state.alarms:
            notes.append("[red]precision alarm[/]")
        if state.instance_faults(iid):
            notes.append(f"[red]{len(state.instance_faults(iid))} fault(s)[/]")
        if state.snapshot_pending(iid):
            notes.append("[blue]snapshot pending[/]")
        table.add_row(
            str(iid),
            str(inst.spec.role),
            inst.spec.engine_type,
            f"[{STATE_STYLE.get(st, 'white')}]{st}[/]" + (" " + " ".join(notes) if notes else ""),
            "\n".join(eps),
            f"{running}/{waiting}",
            _age(now, last_hb),
        )
    free = [n for n in state.nodes.values() if n.instance_id is None]
    for node in sorted(free, key=lambda n: n.order):
        table.add_row(
            "-",
            str(node.reg.role),
            node.reg.engine_type,
            "[dim]free node[/]",
            f"{node.node_id} {node.reg.pod_ip}",
            "",
            _age(now, node.last_hb_ts),
        )
    leader = state.leader.leader_id if state.leader else "none"
    table.caption = (
        f"leader {leader} · {len(state.nodes)} nodes · {len(state.faults)} open faults · "
        f"{len(state.alarms)} precision alarms · log seq {state.last_seq}"
        + (f"\nnats: {placement.describe()}" if placement is not None else "")
    )
    return table


def ready_summary(state: ClusterState) -> tuple[int, int]:
    """(active instances, all instances)."""
    active = sum(1 for i in state.instances.values() if i.state == InstanceState.ACTIVE)
    return active, len(state.instances)
