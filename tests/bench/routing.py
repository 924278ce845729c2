"""`just bench routing`: CPU of the coordinator's routing logic per request, against its budget.

The hot path's routing is: plan for the model, candidates per role, a policy's pick, in-flight
accounting. Measured here without any I/O over a table of 16 prefill + 16 decode + 16 union
endpoints (breaker wired in), per policy, plus the fold costs (a heartbeat, a replayed event).
Each figure is CPU time, the best of several rounds. The budget for all routing logic is ~40 µs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from coordinator.policies import REGISTRY, RequestInfo, make_policy, prompt_prefix
from coordinator.table import RoutingTable
from core.events import EventBase, Role
from tests.unit.coord_events import heartbeat, instance_events

BUDGET_US = 40.0


def build_table(per_role: int) -> tuple[RoutingTable, list[tuple[int, EventBase]]]:
    """A table with `per_role` P, D and union instances, and the events that built it."""
    events: list[tuple[int, EventBase]] = []
    seq = 0
    iid = 0
    for role in (Role.PREFILL, Role.DECODE, Role.UNION):
        for _ in range(per_role):
            iid += 1
            caps = ("handoff",) if role != Role.UNION else ()
            for ev in instance_events(iid, role, capabilities=caps, model="m"):
                seq += 1
                events.append((seq, ev))
    t = RoutingTable()
    t.apply_all(events)
    return t, events


def per_call_us(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Best round's mean CPU µs per call (process CPU time: other helpers share the cores)."""
    results = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            fn()
        results.append((time.process_time() - start) / n * 1e6)
    return min(results)


def main(argv: list[str]) -> int:
    """Run the routing benchmark and print its BENCH line."""
    ap = argparse.ArgumentParser(prog="bench routing")
    ap.add_argument("--per-role", type=int, default=16)
    ap.add_argument("-n", type=int, default=20000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    table, events = build_table(args.per_role)
    open_circuits: set[str] = {"n1/0"}
    table.is_open = open_circuits.__contains__
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 100},
            {"role": "user", "content": "hi"},
        ],
    }
    results: dict[str, float] = {}

    def union_route(policy_name: str) -> Callable[[], object]:
        policy = make_policy(policy_name)

        def route() -> object:
            plan = table.plan("m")
            info = RequestInfo("m", prompt_prefix(body), "r")
            ep = policy.select(table.candidates(Role.UNION, "m"), info)
            assert ep is not None and plan.kind == "pd"
            ep.inflight += 1
            ep.inflight -= 1
            return ep

        return route

    def pd_route(policy_name: str) -> Callable[[], object]:
        p_policy, d_policy = make_policy(policy_name), make_policy("least_load")

        def route() -> object:
            plan = table.plan("m")
            info = RequestInfo("m", prompt_prefix(body), "r")
            p = p_policy.select(
                table.candidates(Role.PREFILL, "m", engine_type=plan.engine_type, capability=plan.capability),
                info,
            )
            d = d_policy.select(
                table.candidates(Role.DECODE, "m", engine_type=plan.engine_type, capability=plan.capability),
                info,
            )
            assert p is not None and d is not None
            p.inflight += 1
            d.inflight += 1
            p.inflight -= 1
            d.inflight -= 1
            return d

        return route

    for name in sorted(REGISTRY):
        results[f"single_{name}_us"] = per_call_us(union_route(name), args.n, args.rounds)
        results[f"pd_{name}_us"] = per_call_us(pd_route(name), args.n, args.rounds)
    beat = heartbeat("n2", (0, 3, 1))
    results["heartbeat_apply_us"] = per_call_us(lambda: table.apply(beat), args.n, args.rounds)

    def replay() -> object:
        t = RoutingTable()
        t.apply_all(events)
        return t.version

    replay_us = per_call_us(replay, 20, args.rounds)
    results["replay_events_per_s"] = len(events) / (replay_us / 1e6)
    worst = max(v for k, v in results.items() if k.startswith(("single_", "pd_")))
    for key, value in results.items():
        print(f"{key:32s} {value:12.1f}")
    fields = " ".join(f"{k}={v:.1f}" for k, v in results.items())
    print(
        f"BENCH routing {fields} worst_us={worst:.1f} budget_us={BUDGET_US:.0f} budget_ratio={worst / BUDGET_US:.2f}"
    )
    return 0
