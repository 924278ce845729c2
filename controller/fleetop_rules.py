"""Fleet operations as decisions: one `command.engine_op` a node, then the summary.

An open `operator.fleet_op_requested` names the nodes of every instance of its model when it
was folded (`core.handlers.fleetops`). Each of them that still runs that instance gets one
command (its id derives from the operation and the node, so it is sent once); once every one
answered `node.engine_op_completed`, or left (its instance ended, the node went), or stayed
silent past `start_timeout`, the operation is closed with `controller.fleet_op_completed`:
how many engines did it, lacked it (`unsupported`), failed it, and which nodes never answered.
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
    InstanceState,
)
from core.fleetopsstate import FleetOpRecord
from core.ids import derive_id


def fleet_ops(ctx: Ctx) -> list[Decision]:
    """Each open fleet operation's next step: its commands, or its summary."""
    out: list[Decision] = []
    for rec in sorted(ctx.state.ops.fleet.ops.values(), key=lambda r: r.seq):
        out += _step(ctx, rec)
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
