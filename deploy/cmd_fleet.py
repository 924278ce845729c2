"""Fleet-wide engine operations and LoRA adapters: `motor fleet OP --model M`, `motor lora load|unload`.

Each appends one `operator.fleet_op_requested` (`core.fleetopsdata`); the leading controller
sends one command a node of every instance of the model (`controller.fleetop_rules`), each
node agent calls its engines' native route and reports a result per engine, and the
controller closes the operation with a summary, which this command prints (or `--no-wait`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from core.fleetopsdata import FleetOpArgs
from core.fleetopsstate import summary_of
from core.state import ClusterState
from deploy.common import add_nats_args, int_in

ADAPTER_NAME = re.compile(r"[A-Za-z0-9_.:/\-]{1,200}")
# The ops `motor fleet` runs (LoRA adapters have `motor lora`), with what each does.
FLEET_OPS = {
    "flush-cache": "forget the engines' cached prefixes (vLLM /reset_prefix_cache, SGLang /flush_cache)",
    "pause": "hold new generation until continue (vLLM /pause, SGLang /pause_generation)",
    "continue": "resume paused generation (vLLM /resume, SGLang /continue_generation)",
    "reload-weights": "reload the weights (--path for SGLang; vLLM /collective_rpc reload_weights)",
    "sleep": "release GPU memory, refuse generation until wake (vLLM /sleep, SGLang /release_memory_occupation)",
    "wake": "wake sleeping engines (vLLM /wake_up, SGLang /resume_memory_occupation)",
}


def register(sub: Any) -> None:
    fleet = sub.add_parser(
        "fleet",
        help="run an engine operation on every engine of a model (flush-cache, pause, sleep, ...)",
        description="One command a node to every instance of the model, through the log; each engine's "
        "result (ok, unsupported by its engine kind, failed) is in the log and summed up here. "
        "A paused or sleeping instance takes no new requests from the coordinators.",
    )
    fsub = fleet.add_subparsers(dest="fleet_op", metavar="OP", required=True)
    for op, helptext in FLEET_OPS.items():
        p = fsub.add_parser(op, help=helptext)
        if op == "reload-weights":
            p.add_argument("--path", default=None, help="the weights to load (SGLang's model_path)")
        if op == "sleep":
            p.add_argument("--level", type=int_in(1, 2), default=1, help="vLLM's sleep level (1 or 2)")
        _common(p)
        p.set_defaults(func=_fleet)

    lora = sub.add_parser("lora", help="load or unload a LoRA adapter on every engine of a model")
    lsub = lora.add_subparsers(dest="lora_op", metavar="OP", required=True)
    load = lsub.add_parser("load", help="load adapter NAME from PATH; requests may name it as their model")
    load.add_argument("name", metavar="NAME")
    load.add_argument("path", metavar="PATH", help="the adapter's directory, as the engines' host sees it")
    _common(load)
    load.set_defaults(func=_lora)
    unload = lsub.add_parser("unload", help="unload adapter NAME")
    unload.add_argument("name", metavar="NAME")
    _common(unload)
    unload.set_defaults(func=_lora)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the served model name (motor status)")
    p.add_argument("--reason", default="")
    p.add_argument("--no-wait", action="store_true", help="append the request and return")
    p.add_argument("--wait-timeout", type=float, default=300.0, help="give up waiting after this (s)")
    add_nats_args(p, login="operator")


def fleet_progress(state: ClusterState, op_id: str) -> tuple[str, bool]:
    """One line on where the operation is, and whether it is done."""
    fleet = state.ops.fleet
    rec = fleet.ops.get(op_id)
    if rec is not None:
        nodes = len({n for n, _ in rec.targets})
        return f"{len(rec.answered)} of {nodes} node(s) answered ({rec.ok} ok, {rec.failed} failed)", False
    done = summary_of(fleet, op_id)
    if done is not None:
        return f"done: {done}", True
    return "requested; waiting for the controller", False


def _fleet(args: argparse.Namespace) -> int:
    args_ = FleetOpArgs(path=getattr(args, "path", None), level=getattr(args, "level", 1))
    return _request(args, args.fleet_op, args_)


def _lora(args: argparse.Namespace) -> int:
    op = "lora-load" if args.lora_op == "load" else "lora-unload"
    if not ADAPTER_NAME.fullmatch(args.name):
        print(f"motor lora: NAME {args.name!r} must be 1-200 of A-Z a-z 0-9 _ . : / -", file=sys.stderr)
        return 2
    return _request(args, op, FleetOpArgs(lora_name=args.name, path=getattr(args, "path", None)))


def _request(args: argparse.Namespace, op: str, op_args: FleetOpArgs) -> int:
    from core.events import FleetOpRequested, FleetOpRequestedData
    from core.ids import new_id
    from deploy.cmd_lifecycle import _connect, _follow, _run
    from deploy.cmd_ops import _publish
    from deploy.watch import snapshot_state

    async def go(a: argparse.Namespace) -> int:
        nc = await _connect(a)
        try:
            state = await snapshot_state(nc)
            served = sorted({i.spec.model for i in state.instances.values()})
            if a.model not in served:
                print(
                    f"motor: --model {a.model!r}: no instance serves it (served: {', '.join(served) or 'none'})",
                    file=sys.stderr,
                )
                return 2
            data = FleetOpRequestedData(
                op_id=new_id(),
                op=op,  # type: ignore[arg-type]  # one of the parser's choices
                model=a.model,
                args=op_args,
                reason=a.reason or f"motor {op} --model {a.model}",
                requested_by="operator/cli",
            )
            ev = FleetOpRequested(id=data.op_id, ts=time.time(), source="operator/cli", data=data)
            seq = await _publish(a, ev)
            print(f"{op} {data.op_id[:12]} on {a.model} requested, seq {seq}")
            if a.no_wait:
                return 0
            hint = "nodes that do not answer are named in the summary after controller.start_timeout"
            return await _follow(nc, lambda s: fleet_progress(s, data.op_id), a.wait_timeout, hint)
        finally:
            await nc.close()

    return _run(args, go)
