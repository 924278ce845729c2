"""Operator commands: `motor fault report|clear` and `motor precision raise|clear`.

Hardware faults come from operators and tools as events (there is no Kubernetes ConfigMap
here); drills use the same commands.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from core.bounds import MAX_INSTANCE_ID, UINT32_MAX, UINT64_MAX
from deploy.common import add_nats_args, int_in, nats_options, unreachable_hint

LEVELS = ["L1", "L2", "L3", "L4", "L5", "L6"]


def register(sub: Any) -> None:
    fault = sub.add_parser("fault", help="report or clear a fault (operators, drills)")
    fsub = fault.add_subparsers(dest="fault_cmd", metavar="ACTION", required=True)
    rep = fsub.add_parser("report", help="append fault.reported for a node")
    rep.add_argument("--node", required=True, help="node id, e.g. n7")
    rep.add_argument(
        "--level",
        choices=LEVELS,
        help="Motor fault level; default: the fault-code table's (core/faultcodes.py)",
    )
    rep.add_argument("--code", required=True, help="fault code, e.g. CardUnhealthy, NODE_REBOOT or 0x0000001")
    rep.add_argument(
        "--handling",
        help="MindCluster fault_handling (e.g. RestartNPU) that decides the level of a device fault",
    )
    rep.add_argument("--message", default="")
    rep.add_argument(
        "--instance", type=int_in(0, MAX_INSTANCE_ID), default=None, help="instance id, if known"
    )
    rep.add_argument("--endpoint", type=int_in(0, UINT32_MAX), default=None, help="endpoint id, if known")
    rep.add_argument(
        "--kind", choices=["hardware", "software", "operator"], help="default: the table's, else hardware"
    )
    add_nats_args(rep, login="operator")
    rep.set_defaults(func=_fault_report)
    clr = fsub.add_parser("clear", help="append fault.cleared (one fault, or every open fault of a node)")
    which = clr.add_mutually_exclusive_group(required=True)
    which.add_argument("--fault-id")
    which.add_argument("--node", help="clear every open fault of this node")
    clr.add_argument("--reason", default="cleared by operator")
    add_nats_args(clr, login="operator")
    clr.set_defaults(func=_fault_clear)

    prec = sub.add_parser("precision", help="raise or clear a precision alarm on a P/D group")
    psub = prec.add_subparsers(dest="precision_cmd", metavar="ACTION", required=True)
    for name, func in (("raise", _precision_raise), ("clear", _precision_clear)):
        p = psub.add_parser(name, help=f"{name} a precision alarm")
        ids = int_in(0, UINT64_MAX)  # a Motor instance's or an external one's (seed 001: uint64)
        p.add_argument("--d-instance", type=ids, required=True, help="decode (or union) instance id")
        p.add_argument("--p-instance", type=ids, default=None, help="its prefill instance id")
        p.add_argument("--reason", default=f"{name}d by operator")
        add_nats_args(p, login="operator")
        p.set_defaults(func=func)


def _run(args: argparse.Namespace, coro_fn: Any) -> int:
    from streams.errors import NatsUnavailable, StreamsError

    try:
        return int(asyncio.run(coro_fn(args)))
    except (OSError, TimeoutError, StreamsError) as exc:
        if isinstance(exc, StreamsError) and not isinstance(exc, NatsUnavailable):
            print(f"motor: {exc}", file=sys.stderr)
        else:
            print(f"motor: {unreachable_hint(args.nats_url, exc)} ({exc})", file=sys.stderr)
        return 1


async def _publish(args: argparse.Namespace, event: Any) -> int:
    from streams.connection import connect
    from streams.definitions import ensure_streams
    from streams.publisher import Publisher

    nc = await connect(nats_options(args), name="motor-cli")
    try:
        js = nc.jetstream()
        await ensure_streams(js, update=False)  # the controller owns the settings
        return await Publisher(js).publish(event)
    finally:
        await nc.close()


def _fault_report(args: argparse.Namespace) -> int:
    from core import faultcodes
    from core.events import FaultReported, FaultReportedData
    from core.ids import new_id

    entry = faultcodes.lookup(args.code)
    if args.level is None:
        try:
            args.level = faultcodes.level_for(args.code, args.handling)
        except faultcodes.UnknownFaultCode as exc:
            print(f"motor fault report: {exc}", file=sys.stderr)
            return 2
    args.code = faultcodes.canonical(args.code)
    args.kind = args.kind or (entry.kind if entry is not None else "hardware")

    async def go(a: argparse.Namespace) -> int:
        fid = f"f-{new_id()[:12]}"
        ev = FaultReported(
            id=new_id(),
            ts=time.time(),
            source="operator/cli",
            data=FaultReportedData(
                fault_id=fid,
                node_id=a.node,
                level=a.level,
                code=a.code,
                message=a.message,
                instance_id=a.instance,
                endpoint_id=a.endpoint,
                kind=a.kind,
            ),
        )
        seq = await _publish(a, ev)
        print(f"fault {fid} reported on {a.node} ({a.level} {a.code}), seq {seq}")
        return 0

    return _run(args, go)


def _fault_clear(args: argparse.Namespace) -> int:
    from core.events import FaultCleared, FaultClearedData
    from core.ids import new_id

    async def go(a: argparse.Namespace) -> int:
        targets: list[tuple[str, str]] = []
        if a.fault_id:
            state = await _fold(a)
            rec = state.faults.get(a.fault_id)
            if rec is None:
                print(
                    f"motor: no open fault {a.fault_id!r} (see `motor replay --explain node N`)",
                    file=sys.stderr,
                )
                return 2
            targets.append((a.fault_id, rec.data.node_id))
        else:
            state = await _fold(a)
            targets = [(f.data.fault_id, a.node) for f in state.node_faults(a.node)]
            if not targets:
                print(f"no open faults on {a.node}")
                return 0
        for fid, node in targets:
            ev = FaultCleared(
                id=new_id(),
                ts=time.time(),
                source="operator/cli",
                data=FaultClearedData(fault_id=fid, node_id=node, reason=a.reason),
            )
            seq = await _publish(a, ev)
            print(f"fault {fid} on {node} cleared, seq {seq}")
        return 0

    return _run(args, go)


async def _fold(args: argparse.Namespace) -> Any:
    from streams.connection import connect
    from streams.offline import fold_stream

    nc = await connect(nats_options(args), name="motor-cli")
    try:
        state, _stats = await fold_stream(nc)
        return state
    finally:
        await nc.close()


def _precision_raise(args: argparse.Namespace) -> int:
    from core.events import PrecisionAlarmRaised, PrecisionAlarmRaisedData
    from core.ids import new_id

    async def go(a: argparse.Namespace) -> int:
        alarm = f"a-{new_id()[:12]}"
        ev = PrecisionAlarmRaised(
            id=new_id(),
            ts=time.time(),
            source="operator/cli",
            data=PrecisionAlarmRaisedData(
                alarm_id=alarm,
                d_instance_id=a.d_instance,
                p_instance_id=a.p_instance,
                reason=a.reason,
                detector="operator",
            ),
        )
        seq = await _publish(a, ev)
        print(f"precision alarm {alarm} raised on d {a.d_instance}, seq {seq}")
        return 0

    return _run(args, go)


def _precision_clear(args: argparse.Namespace) -> int:
    from core.events import PrecisionAlarmCleared, PrecisionAlarmClearedData
    from core.ids import new_id

    async def go(a: argparse.Namespace) -> int:
        ev = PrecisionAlarmCleared(
            id=new_id(),
            ts=time.time(),
            source="operator/cli",
            data=PrecisionAlarmClearedData(
                d_instance_id=a.d_instance, p_instance_id=a.p_instance, reason=a.reason
            ),
        )
        seq = await _publish(a, ev)
        print(f"precision alarm on d {a.d_instance} cleared, seq {seq}")
        return 0

    return _run(args, go)
