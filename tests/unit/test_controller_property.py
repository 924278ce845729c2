"""Determinism of fold + decide over random valid histories (hypothesis).

A random history interleaves what agents, operators and time do with the controller's own
decisions. Folding it in one go, in two parts across a checkpoint (`state_to_dict` through
JSON and back), and after an export/import through the codec gives the same state and the
same decisions; every logged decision is reproduced by `motor replay --verify` from MOTOR
alone (heartbeat-driven ones excepted, and marked); and decide is level-based.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.decide import decide
from core import subjects
from core.codec import decode, encode
from core.events import EndpointStatus, EventBase, FaultLevel, Role, SnapshotPhase
from core.reducer import fold
from core.state import state_from_dict, state_to_dict
from replay.verify import verify
from tests.unit.controller_log import Log, config

NODES = ("a", "b", "c", "d", "e")
CONFIGS = (
    config(union=1),
    config(union=2, nnodes=2),
    config(prefill=2, decode=1, scale_p2d=True),
    config(prefill=1, decode=1),
)

op = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(NODES), st.integers(0, 2)),
    st.tuples(st.just("deregister"), st.sampled_from(NODES)),
    st.tuples(st.just("hb"), st.sampled_from(NODES)),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 5.0, 11.0, 31.0, 61.0])),
    st.tuples(st.just("agents"), st.booleans()),
    st.tuples(st.just("status"), st.sampled_from(NODES), st.sampled_from(list(EndpointStatus))),
    st.tuples(st.just("refuse"), st.sampled_from(NODES)),
    st.tuples(st.just("fault"), st.sampled_from(NODES), st.sampled_from(list(FaultLevel))),
    st.tuples(st.just("clear"), st.integers(0, 3)),
    st.tuples(st.just("alarm"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("snapshot"), st.sampled_from(NODES), st.sampled_from(list(SnapshotPhase))),
    st.tuples(st.just("decide")),
    st.tuples(st.just("decide")),
    st.tuples(st.just("decide")),
    st.tuples(st.just("up")),
)


def roles(log: Log) -> list[Role]:
    return list(log.cfg.sections())


def bring_up(log: Log) -> None:
    """A cluster that came up: every node registered with a role the config uses, READY."""
    for i, nid in enumerate(NODES):
        log.register(nid, roles(log)[i % len(roles(log))], ip=f"10.0.0.{i + 1}")
    for _ in range(4):
        log.step()
        log.agents()
    log.step()


def play(log: Log, ops: list[tuple[Any, ...]]) -> None:
    for o in ops:
        kind, args = o[0], o[1:]
        nodes = log.state.nodes
        if kind == "register":
            rs = roles(log)
            log.register(args[0], rs[args[1] % len(rs)], ip=f"10.0.0.{NODES.index(args[0]) + 1}")
        elif kind == "up":
            for _ in range(3):
                log.step()
                log.agents()
        elif kind == "deregister" and args[0] in nodes:
            log.deregister(args[0])
        elif kind == "hb" and args[0] in nodes:
            log.heartbeat(args[0])
        elif kind == "tick":
            log.tick(args[0], heartbeats=False)
        elif kind == "agents":
            log.agents(ready=args[0])
        elif kind == "status" and args[0] in nodes:
            log.status(args[0], 0, args[1])
        elif kind == "refuse" and args[0] in nodes and nodes[args[0]].start_cmd is not None:
            log.refused(args[0])
        elif kind == "fault" and args[0] in nodes:
            log.fault(args[0], args[1])
        elif kind == "clear" and log.state.faults:
            faults = sorted(log.state.faults)
            log.clear_fault(faults[args[0] % len(faults)])
        elif kind == "alarm":
            log.alarm(args[0], args[0] + 1 if args[1] else None)
        elif kind == "snapshot" and args[0] in nodes:
            log.snapshot(args[0], args[1])
        elif kind == "decide":
            log.step()


@dataclass(frozen=True)
class Rec:
    seq: int
    subject: str
    event: Any


def dump(state: Any) -> Any:
    return orjson.loads(orjson.dumps(state_to_dict(state)))


def decided(state: Any, cfg: Any, now: float) -> list[Any]:
    return [d.event.model_dump(mode="json") for d in decide(state, cfg, now)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=st.sampled_from(CONFIGS),
    up=st.booleans(),
    ops=st.lists(op, min_size=1, max_size=80),
    cut=st.floats(0, 1),
)
def test_fold_and_decide_are_deterministic(
    cfg: Any, up: bool, ops: list[tuple[Any, ...]], cut: float
) -> None:
    log = Log(cfg)
    if up:
        bring_up(log)
    play(log, ops)
    now = log.now + 1.0
    folded = log.folded
    # One go.
    whole = fold(folded)
    assert dump(whole) == dump(log.state)
    want = decided(whole, cfg, now)
    # Two parts across a checkpoint.
    k = int(cut * len(folded))
    first = fold(folded[:k])
    restored = state_from_dict(orjson.loads(orjson.dumps(state_to_dict(first))))
    two = fold(folded[k:], restored)
    assert dump(two) == dump(whole)
    assert decided(two, cfg, now) == want
    # Export and import through the codec.
    imported: list[tuple[int, EventBase]] = [(seq, decode(encode(ev))) for seq, ev in folded]
    again = fold(imported)
    assert dump(again) == dump(whole)
    assert decided(again, cfg, now) == want
    # Replay of MOTOR alone reproduces every decision that does not rest on heartbeats.
    records = [Rec(seq, subjects.for_event(ev), ev) for seq, ev in log.events]
    report = verify(records, lambda s, t: decide(s, cfg, t))
    assert report.ok, [m.render() for m in report.mismatches]
    # Level-based: the same state gives the same decisions, applied ones are not made again.
    ds = decide(log.state, cfg, now)
    assert [d.id for d in ds] == [d.id for d in decide(log.state, cfg, now)]
    assert len({d.id for d in ds}) == len(ds)
    log.now = now
    log.commit(ds)
    assert not {d.id for d in log.decide()} & {d.id for d in ds}
