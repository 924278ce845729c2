"""Realistic events for the streams tests (valid, varied, deterministic by index)."""

from __future__ import annotations

from core.events import (
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    FaultLevel,
    FaultReported,
    FaultReportedData,
)
from core.ids import derive_id


def status_changed(i: int, node: str = "n1", ts: float | None = None) -> EndpointStatusChanged:
    """The i-th endpoint status change of a node (alternating READY / ABNORMAL)."""
    status = EndpointStatus.READY if i % 2 == 0 else EndpointStatus.ABNORMAL
    data = EndpointStatusChangedData(
        node_id=node, endpoint_id=i % 4, instance_id=1, status=status, reason=f"r{i}"
    )
    return EndpointStatusChanged(
        id=derive_id("esc", node, i),
        ts=ts if ts is not None else 1_700_000_000.0 + i,
        source=f"nodeagent/{node}",
        data=data,
    )


def fault(i: int, node: str = "n1") -> FaultReported:
    data = FaultReportedData(fault_id=f"f{i}", node_id=node, level=FaultLevel.L3, code="E1", message="m")
    return FaultReported(
        id=derive_id("fault", node, i), ts=1_700_000_000.0 + i, source=f"nodeagent/{node}", data=data
    )


def mixed(n: int, nodes: int = 5) -> list[EventBase]:
    """n events over a few nodes and kinds (so subjects differ)."""
    out: list[EventBase] = []
    for i in range(n):
        node = f"n{i % nodes}"
        out.append(fault(i, node) if i % 7 == 3 else status_changed(i, node))
    return out
