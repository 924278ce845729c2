"""Operator commands on the fleet's lifecycle: `motor drain`, `uncordon`, `scale`, `restart --rolling`.

Each appends one operator request to the log (`core.opsdata`); the leading controller carries
it out (`controller.operation_rules`), and the command follows the log, printing each step,
until it is done (or `--no-wait`). What it asked for and what became of it stay in the log:
`motor replay --explain instance N` tells the story afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

from core.events import InstanceState, Role
from core.state import ClusterState
from deploy.common import add_nats_args, int_in

ROLES = [r.value for r in Role]


def register(sub: Any) -> None:
    drain = sub.add_parser(
        "drain",
        help="take an instance (or a node's) out of routing, let it finish, stop it",
        description="The instance leaves routing at once; what it carries finishes (at most --timeout), "
        "then its engines stop. A node drain also cordons the node (`motor uncordon NODE` gives it back); "
        "an instance drain leaves its nodes free, so the controller builds a fresh instance on them.",
    )
    dsub = drain.add_subparsers(dest="drain_target", metavar="TARGET", required=True)
    for target, kind, helptext in (
        ("instance", int_in(0, 2**31 - 1), "instance id (motor status)"),
        ("node", str, "node id (motor status)"),
    ):
        p = dsub.add_parser(target, help=f"drain one {target}")
        p.add_argument("id", type=kind, metavar="ID", help=helptext)
        _common(p, "how long it may take to finish what it carries (default: controller.drain_timeout, 30)")
        p.set_defaults(func=_drain)

    unc = sub.add_parser("uncordon", help="let the controller assemble instances on a drained node again")
    unc.add_argument("node", metavar="NODE")
    unc.add_argument("--reason", default="uncordoned by operator")
    add_nats_args(unc, login="operator")
    unc.set_defaults(func=_uncordon)

    scale = sub.add_parser(
        "scale",
        help="change how many instances of a role run (ROLE=N ...)",
        description="Scale up takes free registered nodes of the role; scale down drains the newest "
        "instances first. The count holds until the next `motor scale` (the config's until then).",
    )
    scale.add_argument("targets", nargs="+", metavar="ROLE=N", help=f"ROLE one of {', '.join(ROLES)}")
    scale.add_argument("--reason", default="")
    scale.add_argument("--no-wait", action="store_true", help="append the request and return")
    scale.add_argument("--wait-timeout", type=float, default=300.0, help="give up waiting after this (s)")
    add_nats_args(scale, login="operator")
    scale.set_defaults(func=_scale)

    restart = sub.add_parser(
        "restart",
        help="replace every instance of a model, one at a time (--rolling)",
        description="Each old instance drains only once every instance of the model is ACTIVE and its "
        "roles are at their wanted count; a free node builds the new instance first (a surge).",
    )
    restart.add_argument("--rolling", metavar="MODEL", required=True, help="the served model name")
    _common(restart, "each old instance's drain (default: controller.drain_timeout, 30)")
    restart.set_defaults(func=_restart)


def _common(p: argparse.ArgumentParser, timeout_help: str) -> None:
    p.add_argument("--timeout", type=float, default=30.0, help=timeout_help)
    p.add_argument("--reason", default="")
    p.add_argument("--no-wait", action="store_true", help="append the request and return")
    p.add_argument("--wait-timeout", type=float, default=None, help="give up waiting after this (s)")
    add_nats_args(p, login="operator")


def parse_scale(targets: list[str]) -> dict[str, int]:
    """`ROLE=N` arguments as {role: N}; ValueError naming the bad one."""
    out: dict[str, int] = {}
    for t in targets:
        role, eq, n = t.partition("=")
        if not eq or role not in ROLES:
            raise ValueError(f"{t!r}: expected ROLE=N with ROLE one of {', '.join(ROLES)}")
        try:
            count = int(n)
        except ValueError:
            raise ValueError(f"{t!r}: N must be a whole number of instances") from None
        if count < 0:
            raise ValueError(f"{t!r}: N must be 0 or more")
        out[role] = count
    return out


# --------------------------------------------------------------------------- progress (pure)


def drain_progress(state: ClusterState, iid: int) -> tuple[str, bool]:
    """What the drain of instance `iid` has come to, and whether it is over."""
    inst = state.instances.get(iid)
    if inst is None:
        return f"instance {iid} drained and stopped", True
    rec = state.ops.drains.get(iid)
    if rec is None:
        return f"instance {iid} is {inst.state.value}, not draining (yet)", False
    stops = []
    for nid in inst.node_ids:
        node = state.nodes.get(nid)
        cmd = node.stop_cmd if node is not None else None
        if cmd is None or cmd.seq < rec.seq:
            stops.append(f"{nid}: out of routing")
        elif cmd.status == "pending":
            stops.append(f"{nid}: finishing what it carries (at most {cmd.data.drain_timeout:g}s)")
        else:
            stops.append(f"{nid}: stop {cmd.status}")
    return f"instance {iid} draining: " + "; ".join(stops), False


def rollout_progress(state: ClusterState, rollout_id: str, model: str) -> tuple[str, bool]:
    rec = state.ops.rollouts.get(rollout_id)
    insts = sorted(
        (i for i in state.instances.values() if i.spec.model == model), key=lambda i: i.instance_id
    )
    shown = ", ".join(
        f"{i.instance_id} {i.state.value}{' draining' if i.instance_id in state.ops.drains else ''}"
        for i in insts
    )
    if rec is None:
        return f"rolling restart of {model} done: {shown or 'no instances'}", True
    old = [
        i.instance_id for i in insts if i.assembled_seq < rec.seq and i.instance_id not in state.ops.drains
    ]
    return f"{len(rec.replaced)} replaced, {len(old)} to go; instances: {shown}", False


def scale_progress(state: ClusterState, wanted: dict[str, int]) -> tuple[str, bool]:
    parts, done = [], True
    for role, n in sorted(wanted.items()):
        insts = [i for i in state.instances.values() if i.spec.role.value == role]
        live = [i for i in insts if i.instance_id not in state.ops.drains]
        active = sum(1 for i in live if i.state == InstanceState.ACTIVE)
        draining = len(insts) - len(live)
        done = done and active == n and len(live) == n and not draining
        parts.append(f"{role}: {active}/{n} ACTIVE" + (f", {draining} draining" if draining else ""))
    return "; ".join(parts), done


# --------------------------------------------------------------------------- commands


def _run(args: argparse.Namespace, coro: Callable[[Any], Any]) -> int:
    from deploy.cmd_ops import _run as run_ops

    return run_ops(args, coro)


async def _follow(
    nc: Any, progress: Callable[[ClusterState], tuple[str, bool]], within: float | None, hint: str
) -> int:
    """Print each new step of `progress` on the live log until it says done (0), or time runs out (1)."""
    from deploy.watch import StateWatcher

    watcher = StateWatcher(nc)
    await watcher.start()
    try:
        await asyncio.wait_for(watcher.caught_up.wait(), 60)
        deadline = None if within is None else time.monotonic() + within
        last = ""
        while True:
            line, done = progress(watcher.state)
            if line != last:
                print(f"  {line}", flush=True)
                last = line
            if done:
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                print(f"motor: still not done after {within:g}s; {hint}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.25)
    finally:
        await watcher.stop()


async def _connect(args: argparse.Namespace) -> Any:
    from deploy.common import nats_options
    from streams.connection import connect

    return await connect(nats_options(args), name="motor-cli")


def _drain(args: argparse.Namespace) -> int:
    from core.events import DrainRequested, DrainRequestedData
    from core.ids import new_id
    from deploy.cmd_ops import _publish
    from deploy.watch import snapshot_state

    async def go(a: argparse.Namespace) -> int:
        nc = await _connect(a)
        try:
            state = await snapshot_state(nc)
            if a.drain_target == "node":
                node = state.nodes.get(a.id)
                if node is None:
                    print(f"motor drain: no registered node {a.id!r} (see `motor status`)", file=sys.stderr)
                    return 2
                iid = node.instance_id
            else:
                iid = a.id
                if iid not in state.instances:
                    print(f"motor drain: no live instance {iid} (see `motor status`)", file=sys.stderr)
                    return 2
            data = DrainRequestedData(
                drain_id=new_id(),
                target=a.drain_target,
                instance_id=iid if a.drain_target == "instance" else None,
                node_id=a.id if a.drain_target == "node" else None,
                timeout=a.timeout,
                reason=a.reason or f"motor drain {a.drain_target} {a.id}",
                requested_by="operator/cli",
            )
            ev = DrainRequested(id=data.drain_id, ts=time.time(), source="operator/cli", data=data)
            seq = await _publish(a, ev)
            what = f"node {a.id} cordoned" if a.drain_target == "node" else f"instance {iid}"
            print(f"drain {data.drain_id[:12]} of {what} requested, seq {seq}")
            if iid is None:
                print(
                    f"  node {a.id} runs no instance: nothing to drain; `motor uncordon {a.id}` undoes the cordon"
                )
                return 0
            if a.no_wait:
                return 0
            within = a.wait_timeout if a.wait_timeout is not None else a.timeout + 120
            hint = "see `motor status` and `motor replay --explain instance " + f"{iid}`"
            code = await _follow(nc, lambda s: drain_progress(s, iid), within, hint)
            if code == 0 and a.drain_target == "node":
                print(f"node {a.id} stays cordoned: `motor uncordon {a.id}` gives it back")
            return code
        finally:
            await nc.close()

    return _run(args, go)


def _uncordon(args: argparse.Namespace) -> int:
    from core.events import Uncordoned, UncordonedData
    from core.ids import new_id
    from deploy.cmd_ops import _publish

    async def go(a: argparse.Namespace) -> int:
        data = UncordonedData(node_id=a.node, reason=a.reason, requested_by="operator/cli")
        seq = await _publish(a, Uncordoned(id=new_id(), ts=time.time(), source="operator/cli", data=data))
        print(f"node {a.node} uncordoned, seq {seq}")
        return 0

    return _run(args, go)


def _scale(args: argparse.Namespace) -> int:
    from core.events import ScaleRequested, ScaleRequestedData
    from core.ids import new_id
    from deploy.cmd_ops import _publish

    try:
        wanted = parse_scale(args.targets)
    except ValueError as exc:
        print(f"motor scale: {exc}", file=sys.stderr)
        return 2

    async def go(a: argparse.Namespace) -> int:
        for role, n in wanted.items():
            data = ScaleRequestedData(
                role=Role(role), instances=n, reason=a.reason, requested_by="operator/cli"
            )
            ev = ScaleRequested(id=new_id(), ts=time.time(), source="operator/cli", data=data)
            seq = await _publish(a, ev)
            print(f"{role} scaled to {n}, seq {seq}")
        if a.no_wait:
            return 0
        nc = await _connect(a)
        try:
            hint = "scaling up needs free registered nodes of the role (`motor status` lists them)"
            return await _follow(nc, lambda s: scale_progress(s, wanted), a.wait_timeout, hint)
        finally:
            await nc.close()

    return _run(args, go)


def _restart(args: argparse.Namespace) -> int:
    from core.events import RolloutRequested, RolloutRequestedData
    from core.ids import new_id
    from deploy.cmd_ops import _publish
    from deploy.watch import snapshot_state

    async def go(a: argparse.Namespace) -> int:
        nc = await _connect(a)
        try:
            state = await snapshot_state(nc)
            served = sorted({i.spec.model for i in state.instances.values()})
            if a.rolling not in served:
                print(
                    f"motor restart: no instance serves model {a.rolling!r} (served: {', '.join(served) or 'none'})",
                    file=sys.stderr,
                )
                return 2
            data = RolloutRequestedData(
                rollout_id=new_id(),
                model=a.rolling,
                timeout=a.timeout,
                reason=a.reason or f"motor restart --rolling {a.rolling}",
                requested_by="operator/cli",
            )
            ev = RolloutRequested(id=data.rollout_id, ts=time.time(), source="operator/cli", data=data)
            seq = await _publish(a, ev)
            print(f"rolling restart {data.rollout_id[:12]} of {a.rolling} requested, seq {seq}")
            if a.no_wait:
                return 0
            hint = "an old instance drains only once every instance of the model is ACTIVE (`motor status`)"
            return await _follow(
                nc, lambda s: rollout_progress(s, data.rollout_id, a.rolling), a.wait_timeout, hint
            )
        finally:
            await nc.close()

    return _run(args, go)
