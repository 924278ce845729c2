"""What the folded state keeps of operator requests: drains under way, cordons, scale, rollouts.

Records and their JSON form (checkpoints), beside `core.state`, which holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import immutables

from core.fleetopsstate import NO_FLEET, FleetState, fleet_from_dict, fleet_to_dict


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """An instance being drained: out of routing, finishing what it carries, then stopped."""

    drain_id: str
    timeout: float
    ts: float
    seq: int
    event_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """A rolling restart under way: every instance of `model` assembled before `seq` goes."""

    rollout_id: str
    model: str
    timeout: float
    ts: float
    seq: int
    event_id: str
    replaced: tuple[int, ...] = ()  # the old instances drained so far


@dataclass(frozen=True, slots=True)
class Operations:
    drains: immutables.Map[int, DrainRecord] = field(default_factory=immutables.Map)  # by instance id
    cordoned: frozenset[str] = frozenset()  # node ids
    scale: immutables.Map[str, int] = field(default_factory=immutables.Map)  # role -> instances wanted
    rollouts: immutables.Map[str, RolloutRecord] = field(
        default_factory=immutables.Map
    )  # by rollout id, open ones
    fleet: FleetState = NO_FLEET  # fleet operations and LoRA adapters (`core.fleetopsstate`)


NO_OPERATIONS = Operations()


def ops_to_dict(ops: Operations) -> dict[str, Any]:
    return {
        "drains": {
            str(k): {
                "drain_id": d.drain_id,
                "timeout": d.timeout,
                "ts": d.ts,
                "seq": d.seq,
                "event_id": d.event_id,
                "reason": d.reason,
            }
            for k, d in sorted(ops.drains.items())
        },
        "cordoned": sorted(ops.cordoned),
        "scale": dict(sorted(ops.scale.items())),
        "rollouts": {
            k: {
                "rollout_id": r.rollout_id,
                "model": r.model,
                "timeout": r.timeout,
                "ts": r.ts,
                "seq": r.seq,
                "event_id": r.event_id,
                "replaced": list(r.replaced),
            }
            for k, r in sorted(ops.rollouts.items())
        },
        "fleet": fleet_to_dict(ops.fleet),
    }


def ops_from_dict(raw: dict[str, Any] | None) -> Operations:
    """Inverse of `ops_to_dict`; a checkpoint from before operations has none."""
    if not raw:
        return NO_OPERATIONS
    drains = {int(k): DrainRecord(**d) for k, d in raw.get("drains", {}).items()}
    rollouts = {
        k: RolloutRecord(**{**r, "replaced": tuple(r.get("replaced", ()))})
        for k, r in raw.get("rollouts", {}).items()
    }
    return Operations(
        drains=immutables.Map(drains),
        cordoned=frozenset(raw.get("cordoned", ())),
        scale=immutables.Map({str(k): int(v) for k, v in raw.get("scale", {}).items()}),
        rollouts=immutables.Map(rollouts),
        fleet=fleet_from_dict(raw.get("fleet")),
    )
