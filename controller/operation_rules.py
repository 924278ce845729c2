"""The operator's lifecycle requests as decisions: drain, scale, rolling restart.

A drain (`operator.drain_requested`, from `motor drain`, or one the controller asks for itself
to scale down or to roll a model) has taken the instance out of routing as soon as it is
folded (`coordinator.derive`); here its members get a graceful stop (`drain_timeout` > 0: the
node agent waits until its engines have nothing running or waiting, at most that long), and
once every member answered it the instance is TERMINATED "drained": its nodes are free (unless
cordoned) and assembly builds what the wanted count still asks for. A node agent that never
answers holds the drain at most `timeout` + `start_timeout`.

The wanted count of a role is the config's, or the last `operator.scale_requested`; one more
while a rolling restart of its model is under way (a surge: a free node builds the new
instance before an old one drains). A rollout drains the oldest instance assembled before it
once every instance of the model is ACTIVE and each of its roles has its wanted count (without
the surge), so at most one instance is ever out, and with a spare node none is.
"""

from __future__ import annotations

from controller.rule_context import Cause, Ctx, Decision
from controller.state_queries import is_borrowed
from core.config import EngineSection
from core.events import (
    DrainRequested,
    DrainRequestedData,
    InstanceAssembled,
    InstanceState,
    InstanceStateChanged,
    Role,
    RolloutCompleted,
    RolloutCompletedData,
)
from core.ids import derive_id
from core.state import InstanceRecord

ROLES = (Role.UNION, Role.DECODE, Role.PREFILL)


def wanted(ctx: Ctx, role: Role, sec: EngineSection, *, surge: bool = True) -> int:
    """How many instances of `role` the cluster should run now."""
    n = ctx.state.ops.scale.get(role.value, sec.instances)
    if surge and n > 0 and any(r.model == sec.model for r in ctx.state.ops.rollouts.values()):
        n += 1
    return n


def drain_step(ctx: Ctx, inst: InstanceRecord) -> list[Decision] | None:
    """A draining instance's next move (None: it is not draining). Nothing else moves it meanwhile."""
    rec = ctx.state.ops.drains.get(inst.instance_id)
    if rec is None:
        return None
    cause = Cause(rec.seq, rec.event_id, f"drain {rec.drain_id}: {rec.reason or 'requested'}")
    out: list[Decision] = []
    waiting = False
    limit = rec.timeout + ctx.cfg.controller.start_timeout
    for nid in inst.node_ids:
        node = ctx.state.nodes.get(nid)
        if node is None:
            continue  # gone: nothing of it to wait for
        stop = node.stop_cmd
        if stop is None or stop.seq < rec.seq:
            out.append(ctx.stop(node, inst.instance_id, cause, tag="stop-drain", drain_timeout=rec.timeout))
        elif stop.status == "pending" and ctx.now - stop.ts < limit:
            waiting = True
    if out or waiting:
        return out
    done = Cause(rec.seq, rec.event_id, f"drained ({rec.reason or 'drain ' + rec.drain_id})")
    return [ctx.state_change(inst, InstanceState.TERMINATED, done)]


def _drain(
    ctx: Ctx,
    inst: InstanceRecord,
    cause: Cause,
    *,
    timeout: float | None = None,
    rollout_id: str | None = None,
) -> Decision:
    drain_id = derive_id("drain", inst.instance_id, inst.assembled_id, cause.id)
    data = DrainRequestedData(
        drain_id=drain_id,
        target="instance",
        instance_id=inst.instance_id,
        timeout=ctx.cfg.controller.drain_timeout if timeout is None else timeout,
        reason=cause.reason,
        requested_by="controller",
        rollout_id=rollout_id,
    )
    return Decision(
        DrainRequested(id=drain_id, ts=ctx.now, source=ctx.source, caused_by=cause.caused_by(), data=data)
    )


def scale_down(ctx: Ctx, busy: set[int]) -> list[Decision]:
    """Drain the newest instances of a role beyond its wanted count (borrowed ones are ScaleP2D's)."""
    out: list[Decision] = []
    ops = ctx.state.ops
    for role in ROLES:
        sec = ctx.cfg.section(role)
        if sec is None:
            continue
        n = wanted(ctx, role, sec)
        live = [
            i
            for i in ctx.state.instances.values()
            if i.spec.role == role and i.instance_id not in ops.drains and not is_borrowed(ctx.state, i)
        ]
        if len(live) <= n:
            continue
        why = f"{role.value} scaled to {n}: {len(live)} instances"
        for inst in sorted(live, key=lambda i: (i.assembled_seq, i.instance_id))[n:]:
            if inst.instance_id not in busy:
                out.append(_drain(ctx, inst, Cause(inst.assembled_seq, inst.assembled_id, why)))
    return out


def rollouts(ctx: Ctx, batch: list[Decision]) -> list[Decision]:
    """Each rolling restart's next step: drain the oldest old instance, or say it is done."""
    out: list[Decision] = []
    state, ops = ctx.state, ctx.state.ops
    # Something this batch assembles or terminates changes the counts: judge on the next state.
    moving = any(
        isinstance(d.event, InstanceAssembled)
        or (isinstance(d.event, InstanceStateChanged) and d.event.data.state == InstanceState.TERMINATED)
        for d in batch
    )
    for r in sorted(ops.rollouts.values(), key=lambda r: r.seq):
        insts = [i for i in state.instances.values() if i.spec.model == r.model]
        old = [i for i in insts if i.assembled_seq < r.seq and i.instance_id not in ops.drains]
        if not old and not any(i.instance_id in ops.drains for i in insts):
            data = RolloutCompletedData(
                rollout_id=r.rollout_id,
                model=r.model,
                replaced=r.replaced,
                took=max(0.0, ctx.now - r.ts),
                reason=f"every instance of {r.model} assembled before the rollout was replaced",
            )
            eid = derive_id("rollout-done", r.rollout_id)
            ev = RolloutCompleted(id=eid, ts=ctx.now, source=ctx.source, data=data)
            out.append(Decision(ev))
            continue
        if moving or any(i.instance_id in ops.drains for i in insts):
            continue  # one at a time
        if any(i.state != InstanceState.ACTIVE for i in insts) or not _staffed(ctx, r.model, insts):
            continue  # the last replacement is not serving yet
        victim = min(old, key=lambda i: (i.assembled_seq, i.instance_id))
        why = f"rolling restart {r.rollout_id} of {r.model}: replacing instance {victim.instance_id}"
        out.append(
            _drain(ctx, victim, Cause(r.seq, r.event_id, why), timeout=r.timeout, rollout_id=r.rollout_id)
        )
    return out


def _staffed(ctx: Ctx, model: str, insts: list[InstanceRecord]) -> bool:
    """Every role serving `model` has at least its wanted count (without the surge)."""
    for role in ROLES:
        sec = ctx.cfg.section(role)
        if sec is None or sec.model != model:
            continue
        if sum(1 for i in insts if i.spec.role == role) < wanted(ctx, role, sec, surge=False):
            return False
    return True
