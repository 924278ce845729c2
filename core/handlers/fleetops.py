"""Reducer handlers for fleet operations and LoRA adapters (`core.fleetopsdata`)."""

from __future__ import annotations

import immutables

from core.events import (
    EngineOpCommand,
    EngineOpCompleted,
    FleetOpCompleted,
    FleetOpRequested,
    InstanceState,
)
from core.fastreplace import replace
from core.fleetopsstate import ASLEEP, DONE_KEPT, PAUSED, FleetOpRecord, FleetState, adapters_of
from core.handlers import Changes, handles
from core.state import ClusterState

# What an operation that succeeded leaves its engines in: a mode, or none (None clears it).
_MODE_AFTER: dict[str, str | None] = {"pause": PAUSED, "continue": None, "sleep": ASLEEP, "wake": None}


def _with(s: ClusterState, fleet: FleetState) -> Changes:
    return dict(ops=replace(s.ops, fleet=fleet))


@handles(FleetOpRequested)
def _requested(s: ClusterState, ev: FleetOpRequested, seq: int) -> Changes:
    d = ev.data
    fleet = s.ops.fleet
    if d.op_id in fleet.ops:
        return None
    targets = tuple(
        (nid, iid)
        for iid, inst in sorted(s.instances.items())
        if inst.spec.model == d.model
        and inst.state != InstanceState.TERMINATED
        and (d.instance_id is None or iid == d.instance_id)
        for nid in inst.node_ids
    )
    rec = FleetOpRecord(d.op_id, d.op, d.model, d.args.model_dump(), ev.ts, seq, ev.id, targets)
    fleet = replace(fleet, ops=fleet.ops.set(d.op_id, rec))
    name = d.args.lora_name
    if name and d.op in ("lora-load", "lora-unload") and d.instance_id is None:
        want = fleet.wanted.get(d.model, immutables.Map())
        want = (
            want.set(name, d.args.path or "")
            if d.op == "lora-load"
            else want.delete(name)
            if name in want
            else want
        )
        fleet = replace(fleet, wanted=fleet.wanted.set(d.model, want))
    return _with(s, fleet)


@handles(EngineOpCommand)
def _sent(s: ClusterState, ev: EngineOpCommand, seq: int) -> Changes:
    fleet = s.ops.fleet
    rec = fleet.ops.get(ev.data.op_id)
    if rec is None or ev.data.node_id in rec.sent:
        return None
    rec = replace(rec, sent=rec.sent | {ev.data.node_id})
    return _with(s, replace(fleet, ops=fleet.ops.set(rec.op_id, rec)))


@handles(EngineOpCompleted)
def _answered(s: ClusterState, ev: EngineOpCompleted, seq: int) -> Changes:
    d = ev.data
    fleet = s.ops.fleet
    rec = fleet.ops.get(d.op_id)
    if rec is not None and d.node_id not in rec.answered:
        count = {o: sum(1 for r in d.results if r.outcome == o) for o in ("ok", "unsupported", "failed")}
        if d.refused and not d.results:
            count["failed"] = 1  # the node as one: it ran nothing
        rec = replace(
            rec,
            answered=rec.answered | {d.node_id},
            ok=rec.ok + count["ok"],
            unsupported=rec.unsupported + count["unsupported"],
            failed=rec.failed + count["failed"],
        )
        fleet = replace(fleet, ops=fleet.ops.set(rec.op_id, rec))
    # The engines' mode and adapters follow what they did, whether or not the operation is open.
    if d.instance_id is not None and any(r.outcome == "ok" for r in d.results):
        if d.op in _MODE_AFTER:
            mode = _MODE_AFTER[d.op]
            modes = fleet.modes.delete(d.node_id) if d.node_id in fleet.modes else fleet.modes
            fleet = replace(
                fleet, modes=modes if mode is None else modes.set(d.node_id, (d.instance_id, mode))
            )
        name = d.args.lora_name
        if name and d.op in ("lora-load", "lora-unload"):
            have = adapters_of(fleet, d.node_id, d.instance_id)
            have = have | {name} if d.op == "lora-load" else have - {name}
            fleet = replace(fleet, adapters=fleet.adapters.set(d.node_id, (d.instance_id, have)))
    return None if fleet is s.ops.fleet else _with(s, fleet)


@handles(FleetOpCompleted)
def _completed(s: ClusterState, ev: FleetOpCompleted, seq: int) -> Changes:
    fleet = s.ops.fleet
    if ev.data.op_id not in fleet.ops:
        return None
    done = (*fleet.done, (ev.data.op_id, ev.data.reason))[-DONE_KEPT:]
    return _with(s, replace(fleet, ops=fleet.ops.delete(ev.data.op_id), done=done))
