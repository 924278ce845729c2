"""`just bench replay`: fold rate of a 200k-event log beside the raw ordered-consumer read rate.

Publishes a realistic log (registrations and assemblies, then a mix dominated by endpoint
status changes and command results) to an embedded nats-server, then alternates rounds of
(a) nats-py's ordered push consumer with orjson decode only (the reference) and
(b) `streams.offline.fold_stream`: typed decode + `core.reducer.apply` into a ClusterState.
Rates are the best round of each (the machine is shared; the best is the least disturbed).
`ratio` is the median over rounds of fold/raw measured back to back, which cancels the drift
of a shared machine; `ratio_best` divides the two best rounds.
Last line: `BENCH replay fold_eps=... raw_eps=... ratio=... ratio_best=...`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from core import codec
from core.events import (
    CommandApplied,
    CommandAppliedData,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    FaultCleared,
    FaultClearedData,
    FaultLevel,
    FaultReported,
    FaultReportedData,
    InstanceState,
    InstanceStateChanged,
    InstanceStateChangedData,
    PrecisionAlarmCleared,
    PrecisionAlarmClearedData,
    PrecisionAlarmRaised,
    PrecisionAlarmRaisedData,
    SnapshotCheckpoint,
    SnapshotCheckpointData,
    SnapshotPhase,
)
from core.ids import derive_id
from tests.unit.factories import assembled, registered, start_cmd

NODES = 64
T0 = 1_750_000_000.0


def workload(n: int, seed: int = 7) -> Iterator[EventBase]:
    """n events of a running cluster: setup first, then lifecycle churn."""
    rng = random.Random(seed)
    nodes = [f"node-{i:03d}" for i in range(NODES)]
    produced = 0
    ts = T0
    for i, node in enumerate(nodes):
        yield registered(node, ts=ts + i * 0.01, ip=f"10.0.{i // 250}.{i % 250 + 1}")
        produced += 1
    for k in range(NODES // 2):
        yield assembled(k + 1, [nodes[2 * k], nodes[2 * k + 1]], ts=ts + 1)
        produced += 1
    i = 0
    while produced < n:
        i += 1
        ts += 0.005
        node = nodes[rng.randrange(NODES)]
        inst = nodes.index(node) // 2 + 1
        roll = rng.random()
        eid = derive_id("bench", i)
        src = f"nodeagent/{node}"
        ev: EventBase
        if roll < 0.45:
            status = EndpointStatus.READY if rng.random() < 0.8 else EndpointStatus.ABNORMAL
            ev = EndpointStatusChanged(
                id=eid,
                ts=ts,
                source=src,
                data=EndpointStatusChangedData(node_id=node, endpoint_id=0, instance_id=inst, status=status),
            )
        elif roll < 0.65:
            ev = CommandApplied(
                id=eid,
                ts=ts,
                source=src,
                data=CommandAppliedData(
                    command_id=derive_id("cmd", i), node_id=node, verb="start", instance_id=inst
                ),
            )
        elif roll < 0.75:
            state = InstanceState.ACTIVE if rng.random() < 0.7 else InstanceState.DEGRADED
            ev = InstanceStateChanged(
                id=eid,
                ts=ts,
                source="controller/c1",
                data=InstanceStateChangedData(instance_id=inst, state=state),
            )
        elif roll < 0.83:
            ev = FaultReported(
                id=eid,
                ts=ts,
                source=src,
                data=FaultReportedData(
                    fault_id=f"f{i % 97}", node_id=node, level=FaultLevel.L2, code="HBM_ECC"
                ),
            )
        elif roll < 0.90:
            ev = FaultCleared(
                id=eid, ts=ts, source=src, data=FaultClearedData(fault_id=f"f{i % 97}", node_id=node)
            )
        elif roll < 0.95:
            ev = start_cmd(node, inst, ts=ts, attempt=i)
        elif roll < 0.98:
            ev = SnapshotCheckpoint(
                id=eid,
                ts=ts,
                source=src,
                data=SnapshotCheckpointData(
                    node_id=node, phase=SnapshotPhase.METADATA_PREPARED, instance_id=inst
                ),
            )
        elif roll < 0.99:
            ev = PrecisionAlarmRaised(
                id=eid,
                ts=ts,
                source="coordinator/a",
                data=PrecisionAlarmRaisedData(alarm_id=eid, d_instance_id=inst),
            )
        else:
            ev = PrecisionAlarmCleared(
                id=eid, ts=ts, source="operator", data=PrecisionAlarmClearedData(d_instance_id=inst)
            )
        yield ev
        produced += 1


async def _publish(js: object, n: int) -> tuple[float, float]:
    from streams.publisher import Publisher

    pub = Publisher(js, window=2048, ack_timeout=30.0)  # type: ignore[arg-type]
    total = 0
    t0 = time.perf_counter()
    for ev in workload(n):
        total += len(codec.encode(ev))
        await pub.publish_async(ev)
    await pub.flush()
    return time.perf_counter() - t0, total / n


async def _raw_round(nc: object, n: int) -> float:
    """nats-py ordered push consumer, orjson decode only."""
    js = nc.jetstream()  # type: ignore[attr-defined]
    done = asyncio.get_running_loop().create_future()
    count = 0

    async def cb(msg: object) -> None:
        nonlocal count
        orjson.loads(msg.data)  # type: ignore[attr-defined]
        count += 1
        if count == n and not done.done():
            done.set_result(None)

    t0 = time.perf_counter()
    sub = await js.subscribe(
        "motor.>",
        stream="MOTOR",
        cb=cb,
        ordered_consumer=True,
        pending_msgs_limit=n * 2,
        pending_bytes_limit=1 << 31,
    )
    await asyncio.wait_for(done, 600)
    elapsed = time.perf_counter() - t0
    await sub.unsubscribe()
    return n / elapsed


async def _reader_round(nc: object, n: int) -> float:
    """streams' own reader (raw protocol connection), orjson decode only: the transport alone."""
    from streams.reader import read_batches

    count = 0
    t0 = time.perf_counter()
    async for batch in read_batches(nc):  # type: ignore[arg-type]
        for d in batch:
            orjson.loads(d.data)
        count += len(batch)
    if count != n:
        raise SystemExit(f"reader read {count} events, expected {n}")
    return n / (time.perf_counter() - t0)


async def _fold_round(nc: object, n: int, raw: bool | None = None) -> tuple[float, int]:
    from streams.offline import fold_stream

    state, stats = await fold_stream(nc, raw=raw)  # type: ignore[arg-type]
    if stats.applied + stats.skipped != n:
        raise SystemExit(f"fold read {stats.applied + stats.skipped} events, expected {n}")
    return stats.events_per_second, len(state.nodes)


async def run(n: int, rounds: int, nats_url: str | None) -> dict[str, float]:
    from streams.connection import connect
    from streams.definitions import MOTOR_STREAM, ensure_streams
    from streams.server import EmbeddedNats

    with tempfile.TemporaryDirectory(prefix="motor-bench-") as tmp:
        server = None
        if nats_url is None:
            server = EmbeddedNats(Path(tmp) / "nats")
            await server.start()
            nats_url = server.url
        try:
            nc = await connect(nats_url, name="bench-replay")
            js = nc.jetstream()
            await ensure_streams(js)
            if (await js.stream_info(MOTOR_STREAM)).state.messages != n:
                await js.delete_stream(MOTOR_STREAM)
                await ensure_streams(js)
                pub_s, avg_bytes = await _publish(js, n)
                print(f"published {n} events ({avg_bytes:.0f} B avg) in {pub_s:.1f}s: {n / pub_s:,.0f}/s")
            else:
                sample = [len(codec.encode(ev)) for ev, _ in zip(workload(n), range(5000), strict=False)]
                avg_bytes = sum(sample) / len(sample)
                print(f"reusing the {n} events already in {MOTOR_STREAM}")
            raw: list[float] = []
            fold: list[float] = []
            fold_py: list[float] = []
            reader: list[float] = []
            # One unmeasured round of each first: the first pass through a process pays for
            # growing its heap and warming caches, whichever reader comes first.
            await _raw_round(nc, n)
            await _fold_round(nc, n)
            print("warm-up round done (not counted)", flush=True)
            for r in range(rounds):
                raw.append(await _raw_round(nc, n))
                reader.append(await _reader_round(nc, n))
                eps, nodes = await _fold_round(nc, n)
                fold.append(eps)
                # The same fold through a nats-py subscription instead of the raw reader.
                fold_py.append((await _fold_round(nc, n, raw=False))[0])
                print(
                    f"round {r + 1}: raw {raw[-1]:,.0f}/s  streams reader {reader[-1]:,.0f}/s  fold {fold[-1]:,.0f}/s  "
                    f"fold via nats-py {fold_py[-1]:,.0f}/s  ({nodes} nodes in state)"
                )
            await nc.close()
        finally:
            if server is not None:
                await server.stop()
    return {
        "ratio": statistics.median(f / r for f, r in zip(fold, raw, strict=True)),
        "ratio_best": max(fold) / max(raw),
        "fold_eps": max(fold),
        "raw_eps": max(raw),
        "fold_natspy_eps": max(fold_py),
        "reader_eps": max(reader),
        "avg_bytes": avg_bytes,
    }


def main(argv: list[str]) -> int:
    """Run the replay benchmark; the last line printed is the BENCH line."""
    p = argparse.ArgumentParser(prog="bench replay")
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--nats-url",
        default=None,
        help="use this server; its MOTOR stream is kept if it holds --events events",
    )
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    res = asyncio.run(run(args.events, args.rounds, args.nats_url))
    print(
        f"BENCH replay fold_eps={res['fold_eps']:.0f} raw_eps={res['raw_eps']:.0f} ratio={res['ratio']:.2f} "
        f"ratio_best={res['ratio_best']:.2f} "
        f"fold_natspy_eps={res['fold_natspy_eps']:.0f} reader_eps={res['reader_eps']:.0f} events={args.events} avg_bytes={res['avg_bytes']:.0f}"
    )
    return 0
