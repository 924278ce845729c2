"""`just bench chaos`: repeated faults on the local cluster under client traffic.

One supervised cluster (tests/chaos's: builtin engines, one union instance and a 1P1D pair,
two coordinator replicas, the production breaker and lease) serves a bounded load generator
(CLIENTS concurrent OpenAI SDK clients, chat and completions, streamed and not, temperature 0)
for the whole run, while
1. ENGINE_KILLS engines are killed -9 in turn (union, prefill, decode, …), each while it runs
   requests; the next kill waits until every instance is ACTIVE again and the new process has
   served (bounded);
2. LEADER_KILLS times the leading controller is killed -9 (the supervisor restarts it);
3. NATS is killed -9 once for OUTAGE seconds and started again on the same store.

Reported (definitions also in the README's "Faults" section):
- reroute_p99_ms: p99, over every request in flight at an engine kill that succeeded, of how
  long it stalled: the longest gap between two stream chunks, or for a whole answer its
  latency minus the median latency of the same request in the undisturbed first seconds.
- failover_s: the worst, over the leader kills, of kill -9 → the next
  `controller.leader_changed` (its own timestamp): when decisions resume.
- nats_outage_recover_s: NATS started again → a controller leads, a fold of the log shows
  every instance ACTIVE and a request through the coordinator succeeds.
- failed_requests: requests that did not end with a 200 and a finish_reason, over the run.
- lost_streams: streams that delivered a first chunk and then did not end with exactly the
  text of an undisturbed run (cut, errored, or continued wrongly).
Last line: `BENCH chaos reroute_p99_ms=… failover_s=… nats_outage_recover_s=… failed_requests=… lost_streams=…`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from core.events import Role
from tests.chaos.faults import kill_child, nats_down
from tests.chaos.fleet import ROLES, converged, engines, pid_on, served
from tests.chaos.harness import ChaosCluster
from tests.chaos.load import LoadGen, Outcome
from tests.chaos.scenario import hit_engine


async def _served_again(port: int, old_pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pid = pid_on(port)
        if pid is not None and pid != old_pid and await served(port) > 0:
            return True
        await asyncio.sleep(0.25)
    return False


async def _served_long_enough(cc: ChaosCluster, role: Role) -> None:
    """Wait until the `role` instance has been ACTIVE for the restart ladder's reset time.

    Each kill is meant as an independent fault. One that meets an instance still inside
    `restart_reset_after` counts as a crash in a row, and the `restart_limit`-th fails the
    instance over, which this cluster (no spare node) cannot heal: the controller is right, the
    bench would be measuring a crash loop.
    """
    hold = cc.cfg.controller.restart_reset_after + 0.5  # margin: the log's clock and ours
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = await cc.fold()
        ids = {e.instance_id for e in engines(state) if e.role == role} if state is not None else set()
        if state is not None and ids:
            since = max(state.instances[i].active_ts for i in ids)
            if time.time() - since >= hold:
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {role.value} instance stayed ACTIVE {hold:g} s within 60 s")


async def engine_kills(cc: ChaosCluster, n: int) -> list[float]:
    """Kill `n` engines in turn (mixed roles); the kill times."""
    kills = []
    for i, role in zip(range(n), itertools.cycle(ROLES), strict=False):
        await _served_long_enough(cc, role)
        hit = await hit_engine(cc, role, wait_streams=3.0)
        kills.append(hit.at)
        await cc.wait_until("every instance ACTIVE", converged, 60)
        back = await _served_again(hit.engine.port, hit.pid, 20)
        took = time.time() - hit.at
        print(
            f"engine kill {i + 1}/{n}: {hit.engine.label} with {hit.in_flight} running; "
            f"ACTIVE again{' and serving' if back else ', not served yet'} after {took:.1f} s",
            flush=True,
        )
    return kills


async def leader_kills(cc: ChaosCluster, n: int) -> list[float]:
    """Kill the leading controller `n` times; seconds from each kill to the next leader's decision."""
    took = []
    for i in range(n):
        deadline = time.monotonic() + 60
        while (leader := await cc.leader()) is None:
            assert time.monotonic() < deadline, "no controller leads"
            await asyncio.sleep(0.2)
        seq = await cc.last_seq()
        t = kill_child(cc.cluster, leader)
        decided = await cc.leader_changed(seq, t, 60)
        assert decided is not None, f"no controller took over after {leader} was killed"
        took.append(decided[1] - t)
        print(f"leader kill {i + 1}/{n}: {leader} → {decided[0]} decided after {took[-1]:.2f} s", flush=True)
        await cc.wait_until("every instance ACTIVE", converged, 60)
    return took


async def nats_outage(cc: ChaosCluster, seconds: float) -> float:
    """NATS away `seconds` (kill -9, restarted on the same store); seconds until all recovered."""
    async with nats_down(cc.cluster) as out:
        await asyncio.sleep(seconds)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = await cc.fold(limit=5)
        if (
            state is not None
            and converged(state)
            and await cc.leader() is not None
            and await cc.one_request_ok()
        ):
            took = time.time() - out.ended
            print(f"NATS away {seconds:g} s: recovered {took:.1f} s after it returned", flush=True)
            return took
        await asyncio.sleep(0.2)
    raise AssertionError("the cluster did not recover within 120 s of NATS returning")


def reroute_ms(outcomes: list[Outcome], kills: list[float], baseline: dict[str, float]) -> list[float]:
    """The stall of every successful request that was in flight at a kill."""
    out = []
    for o in outcomes:
        if not o.ok or not any(o.in_flight_at(k) for k in kills):
            continue
        if o.stream:
            out.append(o.max_gap * 1000)
        else:
            out.append(max(0.0, (o.ended - o.started) - baseline.get(o.spec, 0.0)) * 1000)
    return out


def p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as keep:
        d = args.root or keep.enter_context(tempfile.TemporaryDirectory(prefix="motor-bench-chaos-"))
        cc = ChaosCluster(Path(d), coordinators=2)
        await cc.start()
        try:
            load = LoadGen(cc.base_url, clients=args.clients, max_requests=1_000_000)
            async with load:
                await asyncio.sleep(args.warmup)
                calm = list(load.outcomes)
                phases = [("warm-up", time.time())]
                kills = await engine_kills(cc, args.engine_kills)
                phases.append(("leader kills", time.time()))
                failovers = await leader_kills(cc, args.leader_kills)
                phases.append(("NATS outage", time.time()))
                recover = await nats_outage(cc, args.outage)
            outcomes = load.outcomes
            phases[0] = ("engine kills", phases[0][1])
        finally:
            await cc.stop()
    baseline = {
        spec: statistics.median(o.ended - o.started for o in calm if o.spec == spec and o.ok)
        for spec in {o.spec for o in calm if o.ok}
    }
    refs = cc.refs
    lost = [
        o
        for o in outcomes
        if o.stream and o.first_byte is not None and (not o.ok or o.text != refs.get(o.spec))
    ]
    failed = [o for o in outcomes if not o.ok]
    for o in failed:  # what failed, and in which phase: the fix it calls for
        phase = next((name for name, t in reversed(phases) if o.started >= t), "warm-up")
        print(f"failed in {phase}: {o.failure()} ({o.describe(phases[0][1])})")
    # A whole (non-streamed) answer cut by a kill is continued from the text folded so far when
    # its budget is at least `continue_whole_from_tokens`, else generated again. Said apart.
    for kind, stream in (("streams", True), ("whole answers", False)):
        mine = reroute_ms([o for o in outcomes if o.stream is stream], kills, baseline)
        print(f"reroute p99 of {kind} in flight at a kill: {p99(mine):.0f} ms over {len(mine)}")
    return {
        "requests": len(outcomes),
        "reroute_p99_ms": round(p99(reroute_ms(outcomes, kills, baseline))),
        "failover_s": round(max(failovers), 2) if failovers else 0.0,
        "nats_outage_recover_s": round(recover, 1),
        "failed_requests": len(failed),
        "lost_streams": len(lost),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="just bench chaos", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--engine-kills", type=int, default=21, help="engines killed -9, roles in turn")
    p.add_argument("--leader-kills", type=int, default=5, help="leading controllers killed -9")
    p.add_argument("--outage", type=float, default=15.0, help="seconds NATS stays down")
    p.add_argument("--clients", type=int, default=6, help="concurrent clients")
    p.add_argument("--root", help="keep the cluster's files and logs here (default: a temporary dir)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of undisturbed traffic first")
    args = p.parse_args(argv)
    r = asyncio.run(run(args))
    print(f"{r['requests']} requests in all")
    print(
        f"BENCH chaos reroute_p99_ms={r['reroute_p99_ms']} failover_s={r['failover_s']} "
        f"nats_outage_recover_s={r['nats_outage_recover_s']} failed_requests={r['failed_requests']} "
        f"lost_streams={r['lost_streams']}"
    )
    return 0
