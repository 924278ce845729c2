"""Issue 24, as properties over the schema itself (`tests/unit/event_strategies.py`).

- Every number an event carries has bounds, every float is finite, every JSON object from
  outside is checked: a field added without bounds fails here.
- A number out of its bounds makes the event undecodable: poison, skipped and counted.
- No decodable event, of any type, with any value within bounds (the bounds included), makes
  anything raise on a cluster that is up: the codec round-trips it, the reducer folds it, the
  controller decides on it (and every decision decodes), the next reign's term, the lease,
  the checkpoint and the controller's HTTP views are written, and the coordinator's table
  folds it and routes only ports and loads that can be.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.leader import lease_value
from controller.leadership import reign_term
from controller.state_queries import outranking_term
from controller.views import alarms_view, instances_view, nodes_view
from coordinator.model_limits import model_limits
from coordinator.table import RoutingTable
from core.bounds import INT64_MIN, UINT64_MAX
from core.codec import decode, encode
from core.errors import DecodeError
from core.events import (
    ALL_EVENTS,
    EndpointStatus,
    EventBase,
    Heartbeat,
    LeaderChangedData,
    Role,
    StartCommand,
)
from core.redact import redact
from core.reducer import apply
from core.state import ClusterState, state_to_dict
from streams.checkpoint import decode_checkpoint_origin, encode_checkpoint
from streams.poison import NEWER_SCHEMA, UNDECODABLE, reason_for
from tests.unit.controller_log import Log, config
from tests.unit.event_strategies import hostile_events, leaves, wire_events

NODES = ("a", "b", "c", "d")
CONFIGS = (config(union=1), config(prefill=1, decode=1), config(union=1, nnodes=2))


@pytest.mark.parametrize("cls", ALL_EVENTS, ids=lambda c: c.__name__)
def test_every_number_an_event_carries_has_bounds(cls: type[EventBase]) -> None:
    found = list(leaves(cls))
    assert found, "the walk found no number at all"
    for leaf in found:
        where = f"{cls.__name__}.{'.'.join(leaf.path)}"
        if leaf.kind is dict:
            assert leaf.checked, f"{where}: a JSON object from outside must be a JsonObject"
            continue
        assert leaf.lo is not None and leaf.hi is not None, f"{where} has no bounds"
        assert leaf.finite, f"{where} takes NaN or infinity"
        # What the 64-bit encoders (orjson: the lease, checkpoints) can write.
        assert INT64_MIN <= leaf.lo <= leaf.hi <= UINT64_MAX, where


@settings(max_examples=400, deadline=None)
@given(hostile_events())
def test_a_number_out_of_its_bounds_makes_its_event_poison(case: tuple[str, dict[str, Any]]) -> None:
    path, raw = case
    with pytest.raises(DecodeError) as exc:
        decode(json.dumps(raw))
    # What the fold skips it as (streams.poison): an out-of-range schema_version is "newer".
    assert reason_for(exc.value) in (UNDECODABLE, NEWER_SCHEMA), path


# ----------------------------------------------------------------------------- a cluster that is up


def _up(cfg: Any) -> Log:
    log = Log(cfg)
    log.lead(1)
    roles: list[Role] = list(cfg.sections())
    for i, nid in enumerate(NODES):
        log.register(nid, roles[i % len(roles)], ip=f"10.0.0.{i + 1}")
    log.bring_up()
    return log


_BASES = {id(cfg): _up(cfg) for cfg in CONFIGS}


def _fork(base: Log) -> Log:
    log = Log(base.cfg, base.now)
    log.seq, log.state, log._n = base.seq, base.state, base._n
    log.events, log.folded = list(base.events), list(base.folded)
    return log


def _vocab(state: ClusterState) -> dict[str, st.SearchStrategy[Any]]:
    """Names the cluster knows, so drawn events are about its nodes, instances and commands."""
    cmds = sorted(c.data.command_id for n in state.nodes.values() for c in (n.start_cmd, n.stop_cmd) if c)
    iids = sorted(state.instances)
    faults = sorted(state.faults) or ["f?"]
    return {
        "node_id": st.sampled_from(sorted(state.nodes)),
        "command_id": st.sampled_from(cmds),
        "instance_id": st.sampled_from(iids),
        "d_instance_id": st.sampled_from(iids),
        "p_instance_id": st.sampled_from(iids),
        "fault_id": st.sampled_from(faults),
        "code": st.sampled_from(["stale_term", "port_in_use", "CardUnhealthy"]),
        "leader_id": st.sampled_from(["c1", "c2"]),
        "ts": st.floats(990.0, 1010.0),
    }


_EVENTS = {key: wire_events(vocab=_vocab(base.state)) for key, base in _BASES.items()}


def _feed(log: Log, ev: EventBase) -> None:
    if isinstance(ev, Heartbeat):  # their own stream: folded with seq 0, as the controller does
        log.folded.append((0, ev))
        log.state = apply(log.state, ev, 0)
    else:
        log.add(ev)


def _decide(log: Log) -> None:
    ds = log.decide()
    for d in ds:
        assert decode(encode(d.event)) == d.event  # the controller never writes poison
    log.commit(ds)


OPS = st.lists(st.sampled_from(["decide", "agents", "tick", "dead", "hb"]), max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cfg=st.sampled_from(CONFIGS))
def test_no_decodable_event_makes_a_fold_a_decision_or_an_encoder_raise(
    data: st.DataObject, cfg: Any
) -> None:
    log = _fork(_BASES[id(cfg)])
    events = _EVENTS[id(cfg)]
    for _ in range(data.draw(st.integers(1, 4), label="events")):
        raw = data.draw(events, label="event")
        ev = decode(json.dumps(raw))
        assert decode(encode(ev)) == ev
        _feed(log, ev)
        _decide(log)
        for op in data.draw(OPS, label="then"):
            if op == "decide":
                _decide(log)
            elif op == "agents":
                log.agents()
            elif op == "tick":
                log.tick(31.0)
            elif op == "dead" and log.state.nodes:
                nid = sorted(log.state.nodes)[0]
                log.status(nid, 0, EndpointStatus.DEAD)
            elif op == "hb":
                for nid in sorted(log.state.nodes):
                    log.heartbeat(nid)
    state = log.state
    # The leadership: the reign past what the nodes obeyed, its announcement and its lease.
    term = state.leader.term if state.leader is not None else 0
    nxt = reign_term(term, term, outranking_term(state))
    LeaderChangedData(leader_id="c1", term=nxt)
    lease_value("c1", nxt)
    # The controller's HTTP views, encoded as it answers them.
    orjson.dumps(redact(state_to_dict(state)))
    orjson.dumps([instances_view(state), nodes_view(state), alarms_view(state)])
    # The checkpoint holds the state exactly.
    stored, _ = decode_checkpoint_origin(encode_checkpoint(state))
    assert orjson.loads(orjson.dumps(state_to_dict(stored))) == orjson.loads(
        orjson.dumps(state_to_dict(state))
    )
    # The coordinator's fold of the same log, and what it would route.
    table = RoutingTable()
    for seq, ev in log.folded:
        table.apply(ev, seq)
    table.describe()
    for model in [None, *table.models()]:
        table.plan(model)
    model_limits(table.state)
    for ep in table.routable():
        assert 1 <= ep.port <= 65535, ep
        assert min(ep.running, ep.waiting, ep.avail_slots, ep.avail_blocks) >= 0, ep


def test_a_start_naming_no_endpoint_does_not_stop_decide() -> None:
    """Found by the property above: an ACTIVE instance whose member's latest start (another
    tool's) named no endpoint made `_settle` take max() of nothing."""
    log = _fork(_BASES[id(CONFIGS[0])])
    start = log.state.nodes["a"].start_cmd
    assert start is not None
    raw = orjson.loads(encode(StartCommand(id="s", ts=log.now, source="x", data=start.data)))
    raw["data"] |= {"command_id": "no-endpoints", "endpoints": []}
    log.add(decode(orjson.dumps(raw)))
    log.decide()
