"""decide(state, cfg, now) -> decisions: the controller's whole judgement, pure.

Level-based like a Kubernetes reconciler: look at the folded state, emit the events that close
the gap, and nothing when there is none, so deciding again on the state after its own
decisions were applied yields nothing new. No I/O and no clock: `now` (and `hearing`, what the
controller heard of each node on its monotonic clock) are given, which is what lets
`motor replay --verify` re-run it over the log.
"""

from __future__ import annotations

from controller.assembly import assemble
from controller.cleanup import cleanup
from controller.fleetop_rules import fleet_ops
from controller.heard import Hearing
from controller.instance_rules import reconcile, replace_cause
from controller.liveness import liveness
from controller.operation_rules import rollouts, scale_down
from controller.restate import restate
from controller.rule_context import Ctx, Decision
from controller.start_rules import stop_again
from core.config import ClusterConfig
from core.events import (
    FaultCleared,
    FaultReported,
    InstanceAssembled,
    InstanceState,
    InstanceStateChanged,
    PrecisionAlarmCleared,
    PrecisionAlarmRaisedData,
    StartCommand,
)
from core.state import ClusterState

__all__ = ["Decision", "Hearing", "decide"]

TERMINATED = InstanceState.TERMINATED


def decide(
    state: ClusterState,
    cfg: ClusterConfig,
    now: float,
    *,
    source: str = "controller",
    hearing: Hearing | None = None,
) -> list[Decision]:
    """What the controller appends next, given the state folded so far and the time.

    `now` is the wall clock the decisions are stamped with. `hearing` is what the controller
    heard of each node, on its monotonic clock (controller.heard): since when it could hear,
    until when heartbeats could land, and when each node was last heard. Silence is judged on
    it alone; without it (a replay) nobody is judged silent.
    """
    ctx = Ctx.build(state, cfg, now, source, hearing)
    # A batch is appended in order and `motor replay --verify` re-derives each decision on the
    # state after the ones before it, so no decision may be invalidated by folding an earlier
    # one of its batch. Whatever a pending replacement (isolate now, terminate next round)
    # would upset waits for it: the other half of its P/D group (the termination drops their
    # alarm) and assembly (it frees nodes).
    replacing = {
        iid
        for iid, inst in state.instances.items()
        if replace_cause(ctx, inst, [state.nodes.get(n) for n in inst.node_ids]) is not None
    }
    held = {i for iid in replacing for a in ctx.idx.alarms_by_instance.get(iid, ()) for i in _group(a.data)}
    held -= replacing
    out: list[Decision] = []
    busy: set[int] = set(held)
    moved: set[int] = set()  # instances whose members or commands change in this batch
    for iid in sorted(state.instances):
        if iid in held:
            continue
        mine = reconcile(ctx, state.instances[iid])
        if mine:
            busy.add(iid)
            out += mine
            if any(_moves(d) for d in mine):
                moved.add(iid)
    out += cleanup(ctx, moved | held)
    out += stop_again(ctx)
    if not replacing and not any(_frees(d) for d in out):
        out += assemble(ctx, busy)
        out += scale_down(ctx, busy)
    out += rollouts(ctx, out)
    out += fleet_ops(ctx)
    # Restating an instance this batch moves would restate the state it leaves. Before the
    # heartbeat moves, and blind to them: a replay of MOTOR alone (no heartbeats) must make the
    # same restatements, and a heartbeat move of the same instance lands after its restatement.
    touched = {getattr(d.event.data, "instance_id", None) for d in out}
    out += restate(ctx, busy | {i for i in touched if isinstance(i, int)} | held)
    # Last, and only for instances nothing else touched: heartbeat moves never gate the others.
    out += liveness(ctx, busy)
    return out


def _terminates(d: Decision) -> bool:
    return isinstance(d.event, InstanceStateChanged) and d.event.data.state == TERMINATED


def _frees(d: Decision) -> bool:
    """Changes which nodes are free or healthy, or which instance ScaleP2D may take."""
    return _terminates(d) or isinstance(d.event, FaultCleared | FaultReported | PrecisionAlarmCleared)


def _moves(d: Decision) -> bool:
    return _terminates(d) or isinstance(d.event, StartCommand | InstanceAssembled)


def _group(alarm: PrecisionAlarmRaisedData) -> set[int]:
    return {alarm.d_instance_id} | ({alarm.p_instance_id} if alarm.p_instance_id is not None else set())
