"""Reconcile one instance: replace, recover, hold for a snapshot, refresh, start, settle.

The rules run in that order and the first that has something to do wins, so one call never
emits contradictory moves for an instance. None of them reads heartbeat times: heartbeats are
not in the MOTOR log, so every rule here must give the same answer on a replay of MOTOR alone
(`liveness.py` owns the heartbeat rules and marks its decisions as such).

The restart ladder: an instance whose engines crash after READY is restarted at once; each
further crash in a row (the instance served less than `restart_reset_after` before it) waits
a backoff before its restart; the `restart_limit`-th crash in a row fails the instance over
instead (a controller-raised L5 `CrashLoop` fault on the node, handled like any replace-level
fault). The count travels in the start command (`restarts`), so it is read from the log.
"""

from __future__ import annotations

from controller.operation_rules import drain_step
from controller.rule_context import Cause, Ctx, Decision
from controller.start_rules import restarts_of, start_or_give_up, starts
from controller.state_queries import (
    REPLACE_LEVELS,
    RESTART_LEVELS,
    ready_since,
    start_for,
    statuses_since,
)
from core.bounds import MAX_COUNT
from core.config import ControllerConfig
from core.events import EndpointStatus, FaultLevel, InstanceMember, InstanceState
from core.ids import derive_id
from core.state import InstanceRecord, NodeRecord, StartRecord

HB_MARK = "heartbeat"  # decisions whose reason carries this depend on heartbeats
OUT_OF_SERVICE = frozenset({InstanceState.ISOLATED, InstanceState.RECOVERING})
CRASH_LOOP = "CrashLoop"  # the controller's fault for an instance it fails over


def reconcile(ctx: Ctx, inst: InstanceRecord) -> list[Decision]:
    """The decisions that close the gap between this instance and what it should be."""
    maybe_nodes = [ctx.state.nodes.get(nid) for nid in inst.node_ids]
    cause = replace_cause(ctx, inst, maybe_nodes)
    if cause is not None:
        return terminate(ctx, inst, cause, isolate_first=True)
    drained = drain_step(ctx, inst)
    if drained is not None:
        return drained  # draining: it finishes what it carries and stops; nothing restarts it
    nodes = [n for n in maybe_nodes if n is not None]
    cause = _restart_cause(ctx, inst, nodes)
    if cause is not None:
        return _recover(ctx, inst, nodes, cause)  # nothing else moves while a restart is owed
    if _restarting(inst, nodes):
        return _restart_stopped(ctx, inst, nodes, 0)
    if ctx.state.snapshot_pending(inst.instance_id):
        return _snapshot_hold(ctx, inst, nodes)
    return _refresh(ctx, inst, nodes) or starts(ctx, inst, nodes) or _settle(ctx, inst, nodes)


# --------------------------------------------------------------------------- replace


def replace_cause(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord | None]) -> Cause | None:
    """Why the instance must be terminated and rebuilt elsewhere, if it must."""
    for nid, node in zip(inst.node_ids, nodes, strict=True):
        if node is None:
            return Cause(
                inst.assembled_seq, inst.assembled_id, f"member {nid} deregistered: replacing the instance"
            )
    for f in ctx.idx.faults_by_instance.get(inst.instance_id, ()):
        if f.data.level in REPLACE_LEVELS:
            d = f.data
            if d.code == CRASH_LOOP:
                why = f"{d.code} on {d.node_id}: failing instance {inst.instance_id} over to other nodes"
                return Cause(f.seq, f.event_id, why)
            return Cause(f.seq, f.event_id, f"{d.level} fault {d.code} on {d.node_id}: replacing the node")
    return None


def terminate(ctx: Ctx, inst: InstanceRecord, cause: Cause, *, isolate_first: bool) -> list[Decision]:
    """Isolate (optionally), then stop every member and terminate; the nodes become free."""
    if isolate_first and inst.state not in OUT_OF_SERVICE:
        return [ctx.state_change(inst, InstanceState.ISOLATED, cause)]
    out: list[Decision] = []
    for nid in inst.node_ids:
        node = ctx.state.nodes.get(nid)
        if node is None:
            continue
        start = start_for(node, inst.instance_id)
        since = max(cause.seq, inst.assembled_seq, start.seq if start is not None else 0)
        if node.stop_cmd is None or node.stop_cmd.seq < since:
            out.append(ctx.stop(node, inst.instance_id, cause, tag="stop-terminate"))
    out.append(ctx.state_change(inst, InstanceState.TERMINATED, cause))
    return out


# --------------------------------------------------------------------------- restart in place


def _stopped_by_us(node: NodeRecord, start: StartRecord, status_seq: int) -> bool:
    """A stop we sent after the start, before the STOPPED it explains."""
    stop = node.stop_cmd
    return stop is not None and start.seq < stop.seq < status_seq


def _restart_cause(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord]) -> Cause | None:
    """The newest reason to restart the instance's engines that no start has answered yet."""
    iid = inst.instance_id
    causes: list[Cause] = []
    for f in ctx.idx.faults_by_instance.get(iid, ()):
        if f.data.level in RESTART_LEVELS:
            d = f.data
            causes.append(
                Cause(f.seq, f.event_id, f"{d.level} fault {d.code} on {d.node_id}: restarting engines")
            )
    for a in ctx.idx.alarms_by_instance.get(iid, ()):
        causes.append(Cause(a.seq, a.event_id, f"precision alarm {a.data.alarm_id}: isolating the P/D group"))
    for node in nodes:
        cmd = start_for(node, iid)
        if cmd is None:
            continue
        for e, st in statuses_since(node, cmd).items():
            seq = node.endpoint_seq[e]
            if st == EndpointStatus.DEAD or (
                st == EndpointStatus.STOPPED and not _stopped_by_us(node, cmd, seq)
            ):
                why = node.endpoint_reason.get(e) or "no reason given"
                causes.append(
                    Cause(
                        seq,
                        node.endpoint_event_id.get(e, ""),
                        f"endpoint {node.node_id}/{e} {st.value} ({why}): restarting engines",
                    )
                )
    started = [c.seq for n in nodes if (c := start_for(n, iid)) is not None]
    unanswered = [c for c in causes if any(s < c.seq for s in started)]
    return max(unanswered, key=lambda c: c.seq) if unanswered else None


def _recover(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord], cause: Cause) -> list[Decision]:
    """Isolate, stop every member, then start each one whose stop is done (Motor's L3).

    Unless this crash is the `restart_limit`-th in a row: then fail the instance over.
    """
    if inst.state not in OUT_OF_SERVICE:
        crashes = crashes_in_a_row(ctx, inst, nodes, ctx.now)
        if crashes >= ctx.cfg.controller.restart_limit:
            return [_fail_over(ctx, inst, nodes, cause, crashes)]
        return [ctx.state_change(inst, InstanceState.ISOLATED, cause)]
    out: list[Decision] = []
    if inst.state == InstanceState.ISOLATED:
        crashes = crashes_in_a_row(ctx, inst, nodes, ctx.now)
        wait = restart_delay(ctx.cfg.controller, crashes)
        if wait:
            plan = f" (crash {crashes} in a row after READY: restart after a {wait:g}s backoff)"
            cause = Cause(cause.seq, cause.id, cause.reason + plan)
        out.append(ctx.state_change(inst, InstanceState.RECOVERING, cause))
    for node in nodes:
        if node.stop_cmd is None or node.stop_cmd.seq < cause.seq:
            out.append(ctx.stop(node, inst.instance_id, cause, tag="stop-restart"))
    return out + _restart_stopped(ctx, inst, nodes, cause.seq)


def _restarting(inst: InstanceRecord, nodes: list[NodeRecord]) -> bool:
    """Under recovery with a member stopped since its last start: its start is still owed."""
    if inst.state not in OUT_OF_SERVICE:
        return False
    for node in nodes:
        prev = start_for(node, inst.instance_id)
        if node.stop_cmd is not None and (prev is None or node.stop_cmd.seq > prev.seq):
            return True
    return False


def _restart_stopped(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord], since: int) -> list[Decision]:
    """Start again each member of an instance under recovery whose stop (after `since`) is done.

    Keyed on the stop, not on what caused it: a DEAD status, for one, is overwritten by the
    STOPPED the stop reports, but the stop after the last start says a restart is owed.
    """
    if inst.state not in OUT_OF_SERVICE:
        return []
    out: list[Decision] = []
    for rank, node in enumerate(nodes):
        stop = node.stop_cmd
        prev = start_for(node, inst.instance_id)
        if stop is None or stop.seq < since or (prev is not None and prev.seq > stop.seq):
            continue
        if stop.status == "pending" and ctx.now - stop.ts < ctx.cfg.controller.start_timeout:
            continue  # an engine must be down before it is started again
        crashes = crashes_in_a_row(ctx, inst, nodes, stop.ts)
        wait = restart_delay(ctx.cfg.controller, crashes)
        if ctx.now - stop.ts < wait:
            continue  # backing off: crash `crashes` in a row
        said = stop.data.reason or "no reason given"
        cause = Cause(
            stop.seq, stop.data.command_id, f"restart: {node.node_id} stopped ({said}), starting it again"
        )
        out += start_or_give_up(ctx, inst, rank, node, prev, cause, crashes or None)
    return out


def restart_delay(ctrl: ControllerConfig, crashes: int) -> float:
    """How long the restart after the `crashes`-th crash in a row waits (the first: not at all)."""
    if crashes <= 1:
        return 0.0
    # The count comes from the log (`restarts`, up to MAX_COUNT): 2.0 ** 1023 is the largest
    # power of two a float holds, far past any backoff_max from any initial delay there is.
    doublings = min(crashes - 2, 1023)
    return min(ctrl.restart_backoff_initial * 2.0**doublings, ctrl.restart_backoff_max)


def crashes_in_a_row(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord], at: float) -> int:
    """Which crash after READY in a row a crash at `at` is (0: the last start never got READY).

    After READY means the instance turned ACTIVE since its last start; the count goes on from
    the one that start answered unless the instance had served `restart_reset_after` by `at`.
    """
    prevs = [c for n in nodes if (c := start_for(n, inst.instance_id)) is not None]
    if not prevs or inst.active_seq < max(c.seq for c in prevs):
        return 0
    if at - inst.active_ts >= ctx.cfg.controller.restart_reset_after:
        return 1
    # Never past what a start may carry (`core.bounds`): a start counted the most already.
    return min(max(restarts_of(c) for c in prevs) + 1, MAX_COUNT)


def _fail_over(
    ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord], cause: Cause, crashes: int
) -> Decision:
    """The controller's CrashLoop fault on the node the crash came from: replace the instance."""
    node = next((n for n in nodes if cause.seq in n.endpoint_seq.values()), None)
    faulted = [
        f.data.node_id for f in ctx.idx.faults_by_instance.get(inst.instance_id, ()) if f.seq == cause.seq
    ]
    node_id = node.node_id if node is not None else (faulted[0] if faulted else inst.node_ids[0])
    ctrl = ctx.cfg.controller
    msg = (
        f"instance {inst.instance_id} crashed {crashes} times in a row after READY (restart_limit "
        f"{ctrl.restart_limit}, none served {ctrl.restart_reset_after:g}s): failing it over instead of "
        f"restarting; {node_id} sits out for {ctrl.failover_hold:g}s ({cause.reason})"
    )
    fault_id = derive_id("crash-loop", inst.instance_id, cause.id)
    return ctx.fault(fault_id, node_id, FaultLevel.L5, CRASH_LOOP, msg, inst.instance_id, cause)


# --------------------------------------------------------------------------- snapshot, refresh


def _snapshot_hold(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord]) -> list[Decision]:
    if inst.state not in (InstanceState.INITIAL, InstanceState.ACTIVE, InstanceState.DEGRADED):
        return []
    for node in nodes:
        snap = ctx.state.snapshots.get(node.node_id)
        if snap is not None and snap.pending:
            why = f"container snapshot {snap.phase.value} on {node.node_id}: out of service until restored"
            return [ctx.state_change(inst, InstanceState.INACTIVE, Cause(snap.seq, snap.event_id, why))]
    return []


def _refresh(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord]) -> list[Decision]:
    """Members re-registered with a new address or job (a restored snapshot): same id, new spec."""
    spec = inst.spec
    members = tuple(
        InstanceMember(node_id=m.node_id, node_rank=m.node_rank, ip=n.reg.pod_ip, endpoints=n.reg.endpoints)
        for m, n in zip(spec.members, nodes, strict=True)
    )
    job = nodes[0].reg.job_name if nodes else spec.job_name
    if members == spec.members and job == spec.job_name:
        return []
    newest = max(nodes, key=lambda n: n.registered_seq)
    data = spec.model_copy(update={"members": members, "master_dp_ip": members[0].ip, "job_name": job})
    why = f"{newest.node_id} re-registered as {newest.reg.pod_ip} (job {newest.reg.job_name}): refreshing instance"
    cause = Cause(newest.registered_seq, newest.registered_id, why)
    return [ctx.assembled(data, cause, "refresh", *(n.registered_id for n in nodes))]


# --------------------------------------------------------------------------- settle


def _settle(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord]) -> list[Decision]:
    """INITIAL/RECOVERING/DEGRADED/INACTIVE -> ACTIVE when all READY; ACTIVE -> DEGRADED when not."""
    cmds = [start_for(n, inst.instance_id) for n in nodes]
    if not nodes or any(c is None for c in cmds):
        return []
    pairs = [(n, c) for n, c in zip(nodes, cmds, strict=True) if c is not None]
    if all(ready_since(n, c) for n, c in pairs):
        if inst.state == InstanceState.ACTIVE:
            return []
        if inst.state == InstanceState.INACTIVE and HB_MARK in inst.reason:
            return []  # back when heartbeats resume: liveness.py decides that
        seq, eid = max(
            (n.endpoint_seq.get(e, 0), n.endpoint_event_id.get(e, "")) for n in nodes for e in n.endpoint_seq
        )
        return [ctx.state_change(inst, InstanceState.ACTIVE, Cause(seq, eid, "every endpoint READY"))]
    if inst.state != InstanceState.ACTIVE:
        return []
    bad: list[tuple[int, str, str]] = []
    for n, c in pairs:
        since = statuses_since(n, c)
        for e in (ep.id for ep in c.data.endpoints):
            st = since.get(e)
            if st != EndpointStatus.READY:
                label = st.value if st is not None else "unknown"
                bad.append(
                    (
                        n.endpoint_seq.get(e, n.registered_seq),
                        n.endpoint_event_id.get(e) or n.registered_id,
                        f"{n.node_id}/{e} {label}",
                    )
                )
    if not bad:
        return []  # a start that named no endpoint (no agent applies one): nothing to report
    seq, eid, _ = max(bad)
    why = "endpoints not READY: " + ", ".join(b[2] for b in sorted(bad))
    return [ctx.state_change(inst, InstanceState.DEGRADED, Cause(seq, eid, why))]
