"""Deriving endpoints from the folded state: which may take traffic, and why not.

Pure: the routing table calls `derive` when an event made its index dirty, and keeps the
live `Endpoint` objects across derivations (`copy_attrs`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.endpoint import Endpoint, Incarnation
from coordinator.external import external_endpoints
from coordinator.losshold import LossHold
from core.events import EndpointLoad, EndpointStatus, InstanceState, Role
from core.fleetopsstate import adapters_of, mode_of
from core.state import ClusterState

log = logging.getLogger(__name__)

# Instance states whose READY endpoints take traffic. DEGRADED means "serving, part of it
# unhealthy": its READY endpoints still serve; the unhealthy ones are not READY.
ROUTABLE_STATES = frozenset({InstanceState.ACTIVE, InstanceState.DEGRADED})
# Not routable because it failed, not because it is between states (assembling, starting, a
# lost log's re-adoption): what ends the exchanges under way on it (`RoutingTable.on_leave`).
FAILED_STATES = frozenset({InstanceState.ISOLATED, InstanceState.INACTIVE, InstanceState.TERMINATED})
FAILED_STATUSES = frozenset({EndpointStatus.ABNORMAL, EndpointStatus.DEAD, EndpointStatus.STOPPED})


@dataclass(slots=True)
class Derived:
    """One endpoint as derived from the state, before routability filtering."""

    ep: Endpoint
    routable: bool
    why: str  # why not routable, for GET /v1/instances
    failed: bool = False  # not routable because its engine or instance failed (see FAILED_STATES)


def _alarmed(state: ClusterState) -> frozenset[int]:
    ids: set[int] = set()
    for alarm in state.alarms.values():
        ids.add(alarm.data.d_instance_id)
        if alarm.data.p_instance_id is not None:
            ids.add(alarm.data.p_instance_id)
    return frozenset(ids)


def derive(
    s: ClusterState,
    loads: Mapping[tuple[str, int], EndpointLoad],
    incarnations: Mapping[str, Incarnation],
    hold: LossHold,
) -> dict[str, Derived]:
    """Every endpoint the state names, with whether it is routable and why not."""
    alarmed = _alarmed(s)
    out: dict[str, Derived] = {}
    for inst in s.instances.values():
        spec = inst.spec
        inst_ok = inst.state in ROUTABLE_STATES
        alarm = spec.instance_id in alarmed
        drain = s.ops.drains.get(spec.instance_id)
        for member in spec.members:
            node = s.nodes.get(member.node_id)
            caps = spec.capabilities or (node.reg.capabilities if node is not None else ())
            for es in member.endpoints:
                if es.headless:
                    continue  # a DP rank without an HTTP server of its own
                key = f"{member.node_id}/{es.id}"
                load = loads.get((member.node_id, es.id))
                ep = Endpoint(
                    key=key,
                    instance_id=spec.instance_id,
                    role=spec.role,
                    engine_type=spec.engine_type,
                    model=spec.model,
                    host=es.ip,
                    port=es.business_port,
                    bootstrap_port=es.bootstrap_port,
                    capabilities=frozenset(caps),
                    group=None if spec.role == Role.PREFILL else spec.instance_id,
                    running=load.running if load else 0,
                    waiting=load.waiting if load else 0,
                    avail_slots=load.avail_slots if load else 0,
                    avail_blocks=load.avail_blocks if load else 0,
                    adapters=adapters_of(s.ops.fleet, member.node_id, spec.instance_id),
                )
                status = node.endpoint_status.get(es.id) if node is not None else None
                mode = mode_of(s.ops.fleet, member.node_id, spec.instance_id)
                failed = False
                if not inst_ok:
                    why = f"instance {spec.instance_id} is {inst.state.value}"
                    failed = inst.state in FAILED_STATES
                elif drain is not None:
                    # Out of routing for new requests; what it carries finishes (not failed).
                    why = f"instance {spec.instance_id} is draining ({drain.reason or drain.drain_id})"
                elif mode is not None:
                    # `motor fleet pause|sleep`: its engines hold or refuse new requests (not failed).
                    why = f"engines of instance {spec.instance_id} on {member.node_id} are {mode}"
                elif node is None:
                    why = f"node {member.node_id} is not registered"
                elif node.instance_id != spec.instance_id:
                    why = f"node {member.node_id} left instance {spec.instance_id}"
                elif status != EndpointStatus.READY:
                    why = f"endpoint {key} is {status.value if status else 'not started'}"
                    failed = status in FAILED_STATUSES
                elif alarm:
                    why, failed = f"precision alarm on instance {spec.instance_id}", True
                else:
                    why = ""
                if (
                    why
                    and hold.held
                    and not alarm
                    and drain is None
                    and mode is None
                    and node is not None
                    and hold.bridges(
                        key,
                        incarnations.get(key),
                        inst.state,
                        status,
                        node.instance_id,
                        spec.instance_id,
                    )
                ):
                    why = ""  # held across a lost log while the new log re-adopts it
                out[key] = Derived(ep, not why, why, failed and bool(why))
    for ext_id, raw in s.external.items():
        try:
            eps = external_endpoints(ext_id, raw)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # Validated on the way in, but the log may hold entries written by other
            # tools: one bad entry must not take routing down with it.
            log.warning("external instance %s in the log is unusable: %s", ext_id, exc)
            continue
        why = f"precision alarm on instance {ext_id}" if ext_id in alarmed else ""
        for ep in eps:
            out[ep.key] = Derived(ep, not why, why, bool(why))
    return out


def copy_attrs(dst: Endpoint, src: Endpoint) -> None:
    """Carry a fresh derivation onto the live object the proxy holds (and counts in-flight on)."""
    for name in (
        "instance_id",
        "role",
        "engine_type",
        "model",
        "host",
        "port",
        "bootstrap_port",
        "capabilities",
        "group",
        "running",
        "waiting",
        "avail_slots",
        "avail_blocks",
        "adapters",
    ):
        setattr(dst, name, getattr(src, name))
