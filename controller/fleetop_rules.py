"""Fleet operations as decisions: one `command.engine_op` a node, then the summary.

An open `operator.fleet_op_requested` names the nodes of every instance of its model when it
was folded (`core.handlers.fleetops`). Each of them that still runs that instance gets one
command (its id derives from the operation and the node, so it is sent once); once every one
answered `node.engine_op_completed`, or left (its instance ended, the node went), or stayed
silent past `start_timeout`, the operation is closed with `controller.fleet_op_completed`:
how many engines did it, lacked it (`unsupported`), failed it, and which nodes never answered.

The LoRA adapters last loaded for a model (`ops.fleet.wanted`) are the model's desired state:
an ACTIVE instance whose engines lack one gets a `lora-load` of its own (the controller's
`operator.fleet_op_requested` naming the instance), once per instance and adapter: its id
derives from both, and an open or recently closed one is not asked again (a load that failed
is tried again only after `DONE_KEPT` later operations closed).
"""

from __future__ import annotations

from controller.rule_context import Ctx, Decision
from core.events import (
    CausedBy,
    EngineOpCommand,
    EngineOpCommandData,
    FleetOpArgs,
    FleetOpCompleted,
    FleetOpCompletedData,
    FleetOpRequested,
    FleetOpRequestedData,
    InstanceState,
)
from core.fleetopsstate import FleetOpRecord, adapters_of
from core.ids import derive_id


def fleet_ops(ctx: Ctx) -> list[Decision]:
    """Each open fleet operation's next step (its commands, or its summary), then the wanted
    adapters of instances that lack them."""
    out: list[Decision] = []
    for rec in sorted(ctx.state.ops.fleet.ops.values(), key=lambda r: r.seq):
        out += _step(ctx, rec)
    return out + _adapters_wanted(ctx)


def _adapters_wanted(ctx: Ctx) -> list[Decision]:
    fleet = ctx.state.ops.fleet
    if not fleet.wanted:
        return []
    closed = {oid for oid, _ in fleet.done}
    # An adapter some open operation loads or unloads waits for it (its results decide).
    busy = {
        (r.model, r.args.get("lora_name")) for r in fleet.ops.values() if r.op in ("lora-load", "lora-unload")
    }
    out: list[Decision] = []
    for iid, inst in sorted(ctx.state.instances.items()):
        want = fleet.wanted.get(inst.spec.model)
        if not want or inst.state != InstanceState.ACTIVE:
            continue
        for name, path in sorted(want.items()):
            if (inst.spec.model, name) in busy or all(
                name in adapters_of(fleet, nid, iid) for nid in inst.node_ids
            ):
                continue
            oid = derive_id("lora-wanted", iid, inst.assembled_id, name, path)
            if oid in fleet.ops or oid in closed:
                continue
            data = FleetOpRequestedData(
                op_id=oid,
                op="lora-load",
                model=inst.spec.model,
                args=FleetOpArgs(lora_name=name, path=path),
                reason=f"instance {iid} of {inst.spec.model} lacks wanted LoRA adapter {name}",
                requested_by="controller",
                instance_id=iid,
            )
            cause = CausedBy(id=inst.assembled_id, seq=inst.assembled_seq or None)
            out.append(
                Decision(FleetOpRequested(id=oid, ts=ctx.now, source=ctx.source, caused_by=cause, data=data))
            )
    return out


def _here(ctx: Ctx, node_id: str, instance_id: int) -> bool:
    """The node still runs the instance the operation was meant for."""
    node = ctx.state.nodes.get(node_id)
    inst = ctx.state.instances.get(instance_id)
    return (
        node is not None
        and inst is not None
        and inst.state != InstanceState.TERMINATED
        and node.instance_id == instance_id
    )


def _step(ctx: Ctx, rec: FleetOpRecord) -> list[Decision]:
    cause = CausedBy(id=rec.event_id, seq=rec.seq or None)
    out: list[Decision] = []
    waiting = False
    late = ctx.now - rec.ts > ctx.cfg.controller.start_timeout
    for nid, iid in rec.targets:
        if not _here(ctx, nid, iid):
            continue
        if nid not in rec.sent:
            cid = derive_id("engineop", rec.op_id, nid)
            data = EngineOpCommandData(
                command_id=cid,
                node_id=nid,
                instance_id=iid,
                op_id=rec.op_id,
                op=rec.op,  # type: ignore[arg-type]  # folded from a validated request
                args=FleetOpArgs.model_validate(rec.args),
                reason=f"fleet operation {rec.op_id}: {rec.op} on {rec.model}",
                term=ctx.term,
            )
            out.append(
                Decision(EngineOpCommand(id=cid, ts=ctx.now, source=ctx.source, caused_by=cause, data=data))
            )
        elif nid not in rec.answered and not late:
            waiting = True
    if out or waiting:
        return out
    unanswered = tuple(sorted({n for n, _ in rec.targets} - rec.answered))
    summary = FleetOpCompletedData(
        op_id=rec.op_id,
        op=rec.op,  # type: ignore[arg-type]
        model=rec.model,
        ok=rec.ok,
        unsupported=rec.unsupported,
        failed=rec.failed,
        unanswered=unanswered,
        took=max(0.0, ctx.now - rec.ts),
        reason=(
            f"{rec.op} on {rec.model}: {rec.ok} ok, {rec.unsupported} unsupported, {rec.failed} failed"
            + (f", no answer from {', '.join(unanswered)}" if unanswered else "")
        ),
    )
    eid = derive_id("fleetop-done", rec.op_id)
    return [Decision(FleetOpCompleted(id=eid, ts=ctx.now, source=ctx.source, caused_by=cause, data=summary))]
