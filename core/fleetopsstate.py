"""What the folded state keeps of fleet operations: the open ones, each node's engine mode
(paused, asleep) and the LoRA adapters loaded on each node and wanted for each model.

Records and their JSON form (checkpoints); `core.opsstate.Operations` holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import immutables

# A node whose engines are in one of these modes takes no new requests (`coordinator.derive`).
PAUSED, ASLEEP = "paused", "asleep"
DONE_KEPT = 64  # closed operations whose summary the state keeps (what `motor fleet` waits for)


@dataclass(frozen=True, slots=True)
class FleetOpRecord:
    """An open fleet operation: the nodes it targets, which were sent and which answered."""

    op_id: str
    op: str
    model: str
    args: dict[str, Any]
    ts: float
    seq: int
    event_id: str
    targets: tuple[tuple[str, int], ...] = ()  # (node id, instance id) at request time
    sent: frozenset[str] = frozenset()  # node ids
    answered: frozenset[str] = frozenset()
    ok: int = 0
    unsupported: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class FleetState:
    ops: immutables.Map[str, FleetOpRecord] = field(default_factory=immutables.Map)  # open, by op id
    # node id -> (instance id, PAUSED | ASLEEP): the mode of that instance's engines there (a
    # new instance on the node starts fresh engines: the entry no longer applies)
    modes: immutables.Map[str, tuple[int, str]] = field(default_factory=immutables.Map)
    # node id -> (instance id, adapter names loaded on its engines), the same way
    adapters: immutables.Map[str, tuple[int, frozenset[str]]] = field(default_factory=immutables.Map)
    wanted: immutables.Map[str, immutables.Map[str, str]] = field(
        default_factory=immutables.Map
    )  # model -> adapter name -> path: what the operator last asked the model's engines to load
    done: tuple[tuple[str, str], ...] = ()  # (op id, summary) of the last DONE_KEPT closed ones


NO_FLEET = FleetState()


def fleet_to_dict(f: FleetState) -> dict[str, Any]:
    return {
        "ops": {
            k: {
                "op_id": r.op_id,
                "op": r.op,
                "model": r.model,
                "args": r.args,
                "ts": r.ts,
                "seq": r.seq,
                "event_id": r.event_id,
                "targets": [list(t) for t in r.targets],
                "sent": sorted(r.sent),
                "answered": sorted(r.answered),
                "ok": r.ok,
                "unsupported": r.unsupported,
                "failed": r.failed,
            }
            for k, r in sorted(f.ops.items())
        },
        "modes": {k: list(v) for k, v in sorted(f.modes.items())},
        "adapters": {k: [v[0], sorted(v[1])] for k, v in sorted(f.adapters.items())},
        "wanted": {m: dict(sorted(a.items())) for m, a in sorted(f.wanted.items())},
        "done": [list(d) for d in f.done],
    }


def fleet_from_dict(raw: dict[str, Any] | None) -> FleetState:
    """Inverse of `fleet_to_dict`; a checkpoint from before fleet operations has none."""
    if not raw:
        return NO_FLEET
    ops = {
        k: FleetOpRecord(
            **{
                **r,
                "targets": tuple((str(n), int(i)) for n, i in r.get("targets", ())),
                "sent": frozenset(r.get("sent", ())),
                "answered": frozenset(r.get("answered", ())),
            }
        )
        for k, r in raw.get("ops", {}).items()
    }
    return FleetState(
        ops=immutables.Map(ops),
        modes=immutables.Map({str(k): (int(i), str(m)) for k, (i, m) in raw.get("modes", {}).items()}),
        adapters=immutables.Map(
            {str(k): (int(i), frozenset(names)) for k, (i, names) in raw.get("adapters", {}).items()}
        ),
        wanted=immutables.Map(
            {
                str(m): immutables.Map({str(n): str(p) for n, p in a.items()})
                for m, a in raw.get("wanted", {}).items()
            }
        ),
        done=tuple((str(k), str(v)) for k, v in raw.get("done", ())),
    )


def summary_of(f: FleetState, op_id: str) -> str | None:
    """The summary of a closed operation (None: open, unknown, or closed long ago)."""
    return next((why for oid, why in f.done if oid == op_id), None)


def mode_of(f: FleetState, node_id: str, instance_id: int | None) -> str | None:
    """PAUSED or ASLEEP when the engines of `instance_id` on the node are; else None."""
    got = f.modes.get(node_id)
    return got[1] if got is not None and got[0] == instance_id else None


def adapters_of(f: FleetState, node_id: str, instance_id: int | None) -> frozenset[str]:
    """The LoRA adapters loaded on the engines of `instance_id` on the node."""
    got = f.adapters.get(node_id)
    return got[1] if got is not None and got[0] == instance_id else frozenset()
