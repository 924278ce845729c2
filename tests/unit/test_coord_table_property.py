"""RoutingTable's caches never change an answer: any event order, any read pattern, one truth.

Three views of the same random log must agree: a table read after every event (caches built
and dropped all along), a table read only at the end (one lazy rebuild), and a brute-force
oracle computed straight from the folded `ClusterState`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.table import RoutingTable
from core.events import EndpointStatus, EventBase, InstanceState, Role
from core.reducer import fold
from tests.unit.coord_events import (
    alarm,
    alarm_cleared,
    endpoint_status,
    heartbeat,
    instance_events,
    instance_state,
    refreshed,
    seed_instance,
)

ROLES = (Role.PREFILL, Role.DECODE, Role.UNION)
CAPS = ((), ("handoff",), ("bootstrap",), ("handoff", "bootstrap"))
ROUTABLE = {InstanceState.ACTIVE, InstanceState.DEGRADED}


@st.composite
def logs(draw: st.DrawFn) -> list[EventBase]:
    """A random log over up to four instances and a few external engines."""
    n = draw(st.integers(1, 4))
    events: list[EventBase] = []
    for iid in range(1, n + 1):
        events += instance_events(
            iid,
            draw(st.sampled_from(ROLES)),
            engine_type=draw(st.sampled_from(("vllm", "sglang"))),
            capabilities=draw(st.sampled_from(CAPS)),
            model=draw(st.sampled_from(("a", "b"))),
            state=None,
            status=None,
            endpoints=draw(st.integers(1, 2)),
        )
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.just("status"),
                    st.integers(1, n),
                    st.integers(0, 1),
                    st.sampled_from(list(EndpointStatus)),
                ),
                st.tuples(st.just("state"), st.integers(1, n), st.sampled_from(list(InstanceState))),
                st.tuples(st.just("alarm"), st.integers(1, n), st.none() | st.integers(1, n)),
                st.tuples(st.just("clear"), st.integers(1, n)),
                st.tuples(st.just("hb"), st.integers(1, n), st.integers(0, 5)),
                st.tuples(st.just("ext"), st.sampled_from(("set", "add", "del")), st.integers(0, 2)),
            ),
            max_size=40,
        )
    )
    for step in steps:
        kind = step[0]
        if kind == "status":
            _, iid, ep, status = step
            events.append(endpoint_status(f"n{iid}", ep, status, iid))
        elif kind == "state":
            events.append(instance_state(step[1], step[2]))
        elif kind == "alarm":
            events.append(alarm(step[1], step[2]))
        elif kind == "clear":
            events.append(alarm_cleared(step[1]))
        elif kind == "hb":
            events.append(heartbeat(f"n{step[1]}", (0, step[2], 1), (1, step[2] + 1, 0)))
        else:
            _, verb, eid = step
            ext_id = 100 + eid
            insts = [] if verb == "del" else [seed_instance(ext_id, 85, 2, model="a")]
            events.append(refreshed(insts, event=verb, ids=[ext_id]))
    return events


def oracle(events: list[EventBase]) -> dict[str, Any]:
    """Routable keys per (role, model), straight from the folded state."""
    state = fold((i + 1, ev) for i, ev in enumerate(events))
    alarmed = set()
    for a in state.alarms.values():
        alarmed.add(a.data.d_instance_id)
        if a.data.p_instance_id is not None:
            alarmed.add(a.data.p_instance_id)
    out: dict[tuple[Role, str], list[str]] = {}
    for inst in state.instances.values():
        if inst.state not in ROUTABLE or inst.instance_id in alarmed:
            continue
        for m in inst.spec.members:
            node = state.nodes.get(m.node_id)
            if node is None or node.instance_id != inst.instance_id:
                continue
            for ep in m.endpoints:
                if node.endpoint_status.get(ep.id) == EndpointStatus.READY:
                    out.setdefault((inst.spec.role, inst.spec.model), []).append(f"{m.node_id}/{ep.id}")
    for ext_id in state.external:
        if ext_id not in alarmed:
            out.setdefault((Role.UNION, "a"), []).append(f"ext/{ext_id}")
    return {k: sorted(v) for k, v in out.items()}


def view(t: RoutingTable) -> dict[str, Any]:
    out = {}
    for role in ROLES:
        for model in ("a", "b"):
            got = [e.key for e in t.candidates(role, model)]
            if got:
                out[(role, model)] = sorted(got)
    return out


def plans(t: RoutingTable) -> dict[str | None, Any]:
    return {m: t.plan(m) for m in ("a", "b", None)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_interleaved_reads_lazy_rebuild_and_oracle_agree(events: list[EventBase]) -> None:
    eager = RoutingTable()
    versions = []
    for seq, ev in enumerate(events, start=1):
        eager.apply(ev, seq)
        view(eager)
        plans(eager)
        versions.append(eager.version)
    lazy = RoutingTable()
    for seq, ev in enumerate(events, start=1):
        lazy.apply(ev, seq)
    assert view(eager) == view(lazy) == oracle(events)
    assert plans(eager) == plans(lazy)
    assert versions == sorted(versions)  # monotonic
    # Load numbers agree too, whichever way the heartbeats arrived.
    assert [(e.key, e.running, e.waiting) for e in eager.routable()] == [
        (e.key, e.running, e.waiting) for e in lazy.routable()
    ]
