"""Starting an instance's engines: the first start, the ones sent again, and when to give up.

A start that got no READY within its time (or that the node refused) is sent again as the next
attempt, up to `start_attempts`; then the controller raises `StartRetriesExhausted` on the node
and the instance is replaced. A start or stop the node refused `stale_term` is no failed
attempt: the node obeyed a newer reign than the one that sent it (the leader started after a
purge took the older reigns), so the same command goes again once the leader has announced a
reign past it (`controller.leadership.Leadership.outrank`).
"""

from __future__ import annotations

from controller.rule_context import Cause, Ctx, Decision
from controller.state_queries import (
    START_EXHAUSTED,
    outranked,
    ready_since,
    start_for,
    started_after,
    statuses_since,
)
from core.bounds import MAX_COUNT
from core.events import FaultLevel
from core.ids import derive_id
from core.state import InstanceRecord, NodeRecord, StartRecord


def restarts_of(cmd: StartRecord | None) -> int:
    """The crashes in a row the start answered (0: none, or no start)."""
    return cmd.data.restarts if cmd is not None else 0


def _next_attempt(inst: InstanceRecord, prev: StartRecord | None) -> int:
    """A start that led to ACTIVE resets the count; one that did not is a failed attempt."""
    if prev is None or inst.active_seq > prev.seq:
        return 1
    return min(prev.data.attempt + 1, MAX_COUNT)  # a start may carry no more (`core.bounds`)


def start_or_give_up(
    ctx: Ctx,
    inst: InstanceRecord,
    rank: int,
    node: NodeRecord,
    prev: StartRecord | None,
    cause: Cause,
    restarts: int | None = None,
) -> list[Decision]:
    """Start (again) unless `start_attempts` starts got no READY; `restarts` defaults to prev's."""
    attempt = _next_attempt(inst, prev)
    if attempt <= ctx.cfg.controller.start_attempts or prev is None:
        return [ctx.start(inst, rank, attempt, cause, restarts_of(prev) if restarts is None else restarts)]
    prev_id = prev.data.command_id
    fault_id = derive_id("start-exhausted", prev_id)
    if fault_id in ctx.state.faults:
        return []
    n = attempt - 1
    msg = f"{n} start attempt(s) on {node.node_id} for instance {inst.instance_id} got no READY ({cause.reason})"
    why = Cause(prev.seq, prev_id, msg)
    return [ctx.fault(fault_id, node.node_id, FaultLevel.L5, START_EXHAUSTED, msg, inst.instance_id, why)]


# --------------------------------------------------------------------------- starts


def _timed_out(ctx: Ctx, inst: InstanceRecord, node: NodeRecord, prev: StartRecord) -> bool:
    if prev.status == "refused":
        return True
    # No sign of life: resend after start_timeout. Once the agent applied it and the engine
    # reports STARTING, loading may take long: the engine's startup_timeout governs, and the
    # agent reports DEAD when it runs out.
    alive = prev.status == "applied" or bool(statuses_since(node, prev))
    limit = ctx.cfg.controller.start_timeout
    sec = ctx.cfg.section(inst.spec.role)
    if alive and sec is not None:
        limit += sec.health_check_config.startup_timeout
    return ctx.now - prev.ts >= limit


def starts(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord]) -> list[Decision]:
    """Start each member that has no start for this assembly, re-registered without its
    engines, or got no READY in time (up to `start_attempts`); a refusal for an older term
    goes again as the same attempt."""
    iid = inst.instance_id
    out: list[Decision] = []
    for rank, node in enumerate(nodes):
        prev = start_for(node, iid)
        if prev is None or prev.seq < inst.assembled_seq:
            why = f"instance {iid} ({inst.spec.role.value}) assembled: starting rank {rank} on {node.node_id}"
            out.append(ctx.start(inst, rank, 1, Cause(inst.assembled_seq, inst.assembled_id, why)))
        elif node.registered_seq > prev.seq and (node.reg.instance_id != iid or node.reg.restored):
            what = "restored from a snapshot" if node.reg.restored else "re-registered without its engines"
            why = f"{node.node_id} {what}: starting it again for instance {iid}"
            out.append(ctx.start(inst, rank, 1, Cause(node.registered_seq, node.registered_id, why)))
        elif inst.active_seq < prev.seq and not ready_since(node, prev):
            if outranked(prev):
                out += _start_again(ctx, inst, rank, node, prev)
            elif _timed_out(ctx, inst, node, prev):
                how = f"refused: {prev.reason}" if prev.status == "refused" else "no READY in time"
                attempt = prev.data.attempt
                why = f"start attempt {attempt} on {node.node_id} {how}: resending"
                out += start_or_give_up(
                    ctx, inst, rank, node, prev, Cause(prev.seq, prev.data.command_id, why)
                )
    return out


def _start_again(
    ctx: Ctx, inst: InstanceRecord, rank: int, node: NodeRecord, prev: StartRecord
) -> list[Decision]:
    """A start the node refused as of an older leader term is no failed attempt: the same
    attempt goes again once a reign past the node's term leads (until then the leader
    announces one, `controller.leadership`)."""
    seen = outranked(prev)
    if ctx.term <= seen:
        return []
    why = f"{node.node_id} refused the start as of term {prev.data.term} (it obeyed term {seen}): sending it in term {ctx.term}"
    return [
        ctx.start(
            inst, rank, prev.data.attempt, Cause(prev.seq, prev.data.command_id, why), restarts_of(prev)
        )
    ]


def stop_again(ctx: Ctx) -> list[Decision]:
    """Stops a free node refused as of an older leader term, sent again once a reign past
    the node's term leads (the node stays out of assembly meanwhile: `stop_outstanding`)."""
    out: list[Decision] = []
    for nid, node in sorted(ctx.state.nodes.items()):
        stop = node.stop_cmd
        seen = outranked(stop)
        if stop is None or not seen or ctx.term <= seen or nid in ctx.idx.member_of:
            continue
        if stop.seq <= node.registered_seq or started_after(node, stop.seq):
            continue
        why = f"{nid} refused the stop as of term {stop.data.term} (it obeyed term {seen}): sending it in term {ctx.term}"
        out.append(
            ctx.stop(
                node, stop.data.instance_id, Cause(stop.seq, stop.data.command_id, why), tag="stop-again"
            )
        )
    return out
