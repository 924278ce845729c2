"""Closing what recovery finished: restart-level faults and precision alarms.

The controller clears only what it can judge from the log: a software fault (L3/L4) once
the engines it hit were restarted and are READY, its own "start retries exhausted" fault
once the node registers again, its own "crash loop" fault once the node registers again or
sat out `failover_hold`, and a precision alarm once the P/D group was restarted and is READY. Hardware faults (L5/L6) stay open until whoever reported them clears them.
"""

from __future__ import annotations

from controller.instance_rules import CRASH_LOOP
from controller.rule_context import Cause, Ctx, Decision
from controller.state_queries import RESTART_LEVELS, START_EXHAUSTED, fault_instance, ready_since, start_for
from core.state import InstanceRecord


def restarted_since(ctx: Ctx, inst: InstanceRecord, seq: int) -> bool:
    """Every member was started after `seq` and is READY since."""
    for nid in inst.node_ids:
        node = ctx.state.nodes.get(nid)
        cmd = start_for(node, inst.instance_id) if node is not None else None
        if node is None or cmd is None or cmd.seq < seq or not ready_since(node, cmd):
            return False
    return True


def cleanup(ctx: Ctx, busy: set[int]) -> list[Decision]:
    """FaultCleared and PrecisionAlarmCleared for what is resolved (not for `busy` instances)."""
    out: list[Decision] = []
    state = ctx.state
    for f in sorted(state.faults.values(), key=lambda f: f.seq):
        d = f.data
        why = ""
        if d.level in RESTART_LEVELS:
            inst = fault_instance(state, ctx.idx.member_of, f)
            if inst is not None and inst.instance_id in busy:
                continue
            if inst is None:
                why = f"{d.code}: no instance to restart on {d.node_id}; its next start is a fresh one"
            elif restarted_since(ctx, inst, f.seq):
                why = f"{d.code}: instance {inst.instance_id} restarted and READY"
        elif d.code in (START_EXHAUSTED, CRASH_LOOP):
            node = state.nodes.get(d.node_id)
            hold = ctx.cfg.controller.failover_hold
            if node is None or node.registered_seq > f.seq:
                why = f"{d.code}: {d.node_id} registered again (or left); it may be assembled again"
            elif (
                d.code == CRASH_LOOP and ctx.now - f.ts >= hold and f.data.instance_id not in state.instances
            ):
                why = f"{d.code}: {d.node_id} sat out {hold:g}s after its instance was failed over"
        if why:
            out.append(ctx.fault_cleared(d.fault_id, d.node_id, f.event_id, Cause(f.seq, f.event_id, why)))
    for a in sorted(state.alarms.values(), key=lambda a: a.seq):
        d_inst = state.instances.get(a.data.d_instance_id)
        p_id = a.data.p_instance_id
        p_inst = state.instances.get(p_id) if p_id is not None else None
        if a.data.d_instance_id in busy or (p_id is not None and p_id in busy):
            continue
        if d_inst is None:
            why = f"decode instance {a.data.d_instance_id} is gone"
        elif all(restarted_since(ctx, i, a.seq) for i in (d_inst, p_inst) if i is not None):
            group = f"{a.data.d_instance_id}" + (f" and {p_id}" if p_inst is not None else "")
            why = f"precision alarm {a.data.alarm_id}: instances {group} restarted and READY"
        else:
            continue
        out.append(
            ctx.alarm_cleared(
                a.data.d_instance_id, p_id, a.data.alarm_id, a.event_id, Cause(a.seq, a.event_id, why)
            )
        )
    return out
