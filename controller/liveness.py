"""Heartbeat rules: silence -> INACTIVE, longer -> TERMINATED, heartbeats back -> ACTIVE.

Silence is what this controller heard, on its own monotonic clock (`Ctx.hearing`,
controller.heard): never a node's timestamp against the controller's wall clock, so neither
clock stepping or running off moves anyone. It is judged from when the controller could hear
(`Hearing.since`), so an outage of the log, a catch-up or a takeover never reads as every
node gone quiet.

Heartbeats live in MOTOR_HB, not in the log, so these are the only rules that read them, and
every decision they make says "heartbeat" in its reason: a replay of MOTOR alone reproduces
the state from these logged decisions, and `motor replay --verify` knows not to re-derive them.
"""

from __future__ import annotations

import math

from controller.instance_rules import HB_MARK, terminate
from controller.rule_context import Cause, Ctx, Decision
from controller.state_queries import ready_since, start_for
from core.events import InstanceState
from core.state import InstanceRecord, NodeRecord

_WATCHED = frozenset({InstanceState.INITIAL, InstanceState.ACTIVE, InstanceState.DEGRADED})


def silence(ctx: Ctx, node: NodeRecord) -> float:
    """Seconds since this controller last heard the node (inf: never, by this process)."""
    return ctx.hearing.quiet(node.node_id) if ctx.hearing is not None else 0.0


def judged_silence(ctx: Ctx, node: NodeRecord) -> float:
    """Silence as far as it is the node's: never longer than the controller could hear.

    After NATS was away, the fold caught up, or the lease was taken over, every node gets
    `heartbeat_timeout` from then on to be heard: a log that was away silences nobody. Nor is
    silence counted past the last moment heartbeats could land (`Hearing.until`): while the
    heartbeat stream elects a leader, no node grows quieter.
    """
    return ctx.hearing.judged(node.node_id) if ctx.hearing is not None else 0.0


def _silent_for(quiet: float, judged: float) -> str:
    if math.isinf(quiet):  # never heard by this process (a checkpoint's node): say what is known
        return f"silent for {judged:.1f}s (not heard since this controller could hear)"
    heard = f" (heard for {judged:.1f}s of it)" if quiet > judged + 0.05 else ""
    return f"silent for {quiet:.1f}s{heard}"


def _hb_cause(node: NodeRecord, text: str) -> Cause:
    # A heartbeat has no MOTOR sequence; name it by id (the registration before any heartbeat).
    return Cause(0, node.last_hb_id or node.registered_id, text)


def liveness(ctx: Ctx, busy: set[int]) -> list[Decision]:
    """Heartbeat-driven moves for instances no other rule touched in this call."""
    if ctx.hearing is None:
        return []  # nothing heard is known (a replay, a tool): nobody is judged either way
    ctrl = ctx.cfg.controller
    out: list[Decision] = []
    for iid in sorted(ctx.state.instances):
        inst = ctx.state.instances[iid]
        if iid in busy or ctx.state.snapshot_pending(iid):
            continue  # a snapshot gates heartbeats on purpose
        nodes = [n for nid in inst.node_ids if (n := ctx.state.nodes.get(nid)) is not None]
        if not nodes:
            continue
        node = max(nodes, key=lambda n: silence(ctx, n))
        quiet = silence(ctx, node)
        judged = judged_silence(ctx, node)
        said = _silent_for(quiet, judged)
        if judged > ctrl.terminate_after:
            why = f"{HB_MARK} lost: {node.node_id} {said}; terminating, its nodes are freed"
            out += terminate(ctx, inst, _hb_cause(node, why), isolate_first=False)
        elif judged > ctrl.heartbeat_timeout and inst.state in _WATCHED:
            why = f"{HB_MARK} timeout: {node.node_id} {said}"
            out.append(ctx.state_change(inst, InstanceState.INACTIVE, _hb_cause(node, why)))
        elif quiet <= ctrl.heartbeat_timeout and _back(ctx, inst, nodes):
            freshest = min(nodes, key=lambda n: silence(ctx, n))
            why = f"{HB_MARK} resumed and every endpoint READY"
            out.append(ctx.state_change(inst, InstanceState.ACTIVE, _hb_cause(freshest, why)))
    return out


def _back(ctx: Ctx, inst: InstanceRecord, nodes: list[NodeRecord]) -> bool:
    if inst.state != InstanceState.INACTIVE or HB_MARK not in inst.reason:
        return False
    for n in nodes:
        cmd = start_for(n, inst.instance_id)
        if cmd is None or not ready_since(n, cmd):
            return False
    return True
