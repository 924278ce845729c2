"""`just bench routing`: CPU of the coordinator's routing logic per request, against its budget.

The hot path's routing is the chooser's pick of a candidate (plan for the model, candidates per
role, each role's policy pick, union against P/D on load) and in-flight accounting. Measured
here without any I/O, per policy, for three models: `single` has 16 union endpoints, `pd` 16
prefill + 16 decode, `mixed` all 48 (every request weighs a union pick against a P/D pick);
the breaker is wired in with one circuit open. Plus the fold costs (a heartbeat, a replayed
event). Each figure is CPU time, the best of several rounds. The budget for all routing logic
is ~40 µs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from coordinator.choose import Chooser
from coordinator.policies import REGISTRY, RequestInfo, make_policy
from coordinator.table import RoutingTable
from core.events import EventBase, Role
from tests.unit.coord_events import heartbeat, instance_events

BUDGET_US = 40.0


MODELS = {
    "single": (Role.UNION,),
    "pd": (Role.PREFILL, Role.DECODE),
    "mixed": (Role.PREFILL, Role.DECODE, Role.UNION),
}


def build_table(per_role: int) -> tuple[RoutingTable, list[tuple[int, EventBase]]]:
    """A table with `per_role` instances of each role of each model, and the events that built it."""
    events: list[tuple[int, EventBase]] = []
    seq = 0
    iid = 0
    for model, roles in MODELS.items():
        for role in roles:
            for _ in range(per_role):
                iid += 1
                caps = ("handoff",) if role != Role.UNION else ()
                for ev in instance_events(iid, role, capabilities=caps, model=model):
                    seq += 1
                    events.append((seq, ev))
    t = RoutingTable()
    for seq, ev in events:
        t.apply(ev, seq)
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

    def route(policy_name: str, model: str) -> Callable[[], object]:
        router = Chooser(
            table,
            {
                Role.UNION: make_policy(policy_name),
                Role.PREFILL: make_policy(policy_name),
                Role.DECODE: make_policy("least_load"),
            },
        )
        exclude: set[str] = set()

        def one() -> object:
            info = RequestInfo(model, None, "r", body)
            r = router.choose(table.plan(model), info, exclude)
            assert r is not None
            with r.ep.busy as ep:
                if r.prefill is not None:
                    with r.prefill.busy:
                        pass
            return ep

        return one

    for name in sorted(REGISTRY):
        for model in MODELS:
            results[f"{model}_{name}_us"] = per_call_us(route(name, model), args.n, args.rounds)
    beat = heartbeat("n2", (0, 3, 1))
    results["heartbeat_apply_us"] = per_call_us(lambda: table.apply(beat), args.n, args.rounds)

    def replay() -> object:
        t = RoutingTable()
        for seq, ev in events:
            t.apply(ev, seq)
        return t.version

    replay_us = per_call_us(replay, 20, args.rounds)
    results["replay_events_per_s"] = len(events) / (replay_us / 1e6)
    worst = max(v for k, v in results.items() if k.startswith(tuple(f"{m}_" for m in MODELS)))
    for key, value in results.items():
        print(f"{key:32s} {value:12.1f}")
    fields = " ".join(f"{k}={v:.1f}" for k, v in results.items())
    print(
        f"BENCH routing {fields} worst_us={worst:.1f} budget_us={BUDGET_US:.0f} budget_ratio={worst / BUDGET_US:.2f}"
    )
    return 0
