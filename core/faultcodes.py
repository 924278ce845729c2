"""The fault-code table: which Motor level (L1–L6) a reported fault code carries.

Seed 002 names the sources: the node watch reports `NODE_REBOOT` (fault_code `0x0000001`)
at L6; the ConfigMap watch reports MindCluster device faults by type (`CardUnhealthy`,
`CardNetworkUnhealthy`, `NodeUnhealthy`) with a handling strategy (`fault_handling`,
e.g. `SeparateNPU`) that decides the level; engines report software faults through
`/fault_tolerance/status`. Motor's own codes (the node agent's, the controller's) are here
too, so every producer and `motor fault report` agree on a level without an operator
picking one by hand. Pure data and lookups: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.events import FaultLevel

Kind = Literal["software", "hardware", "operator"]


@dataclass(frozen=True, slots=True)
class FaultCode:
    """One known code: its level, the numeric code the seed gives it (if any) and its source."""

    name: str
    level: FaultLevel
    kind: Kind
    source: str
    number: int | None = None
    handled_by: str | None = None  # MindCluster types: the default fault_handling strategy


# MindCluster's fault handling strategy (the ConfigMap's `fault_handling` /
# `large_model_fault_level`) -> Motor level; MindIE-Motor's FaultManager static mapping.
# PreSeparateNPU is L6 statically (MindIE lowers it to L2 while the node serves; Motor's
# controller does not make that distinction).
HANDLING_LEVELS: dict[str, FaultLevel] = {
    "NotHandleFault": FaultLevel.L1,
    "SubHealthFault": FaultLevel.L1,
    "RestartRequest": FaultLevel.L2,
    "RestartBusiness": FaultLevel.L3,
    "FreeRestartNPU": FaultLevel.L4,
    "RestartNPU": FaultLevel.L5,
    "SeparateNPU": FaultLevel.L6,
    "PreSeparateNPU": FaultLevel.L6,
}

NODE_REBOOT = "NODE_REBOOT"
CARD_UNHEALTHY = "CardUnhealthy"
CARD_NETWORK_UNHEALTHY = "CardNetworkUnhealthy"
NODE_UNHEALTHY = "NodeUnhealthy"
ENGINE_UNHEALTHY = "engine_unhealthy"
ENGINE_DEAD = "engine_dead"
NODE_SUICIDE = "NODE_SUICIDE"
START_RETRIES_EXHAUSTED = "StartRetriesExhausted"

CODES: tuple[FaultCode, ...] = (
    FaultCode(NODE_REBOOT, FaultLevel.L6, "hardware", "node watch: node rebooted / NotReady", 0x0000001),
    FaultCode(
        CARD_UNHEALTHY, FaultLevel.L6, "hardware", "ConfigMap watch: NPU card fault", handled_by="SeparateNPU"
    ),
    FaultCode(
        CARD_NETWORK_UNHEALTHY,
        FaultLevel.L6,
        "hardware",
        "ConfigMap watch: NPU network (link) fault",
        handled_by="PreSeparateNPU",
    ),
    FaultCode(
        NODE_UNHEALTHY, FaultLevel.L6, "hardware", "ConfigMap watch: node fault", handled_by="SeparateNPU"
    ),
    FaultCode(ENGINE_UNHEALTHY, FaultLevel.L3, "software", "node agent: /fault_tolerance/status unhealthy"),
    FaultCode(
        ENGINE_DEAD, FaultLevel.L5, "software", "node agent: /fault_tolerance/status dead (or no answer)"
    ),
    FaultCode(
        NODE_SUICIDE,
        FaultLevel.L5,
        "software",
        "node agent: consecutive abnormal heartbeats (HeartbeatManager)",
    ),
    FaultCode(START_RETRIES_EXHAUSTED, FaultLevel.L5, "software", "controller: no READY after every start"),
)

_BY_NAME = {c.name.lower(): c for c in CODES}
_BY_NUMBER = {c.number: c for c in CODES if c.number is not None}


class UnknownFaultCode(ValueError):
    """A code (or handling strategy) the table does not know; the message lists what it knows."""


def lookup(code: str) -> FaultCode | None:
    """The table entry of a code name (any case) or numeric code (`0x0000001`, `1`)."""
    entry = _BY_NAME.get(code.strip().lower())
    if entry is not None:
        return entry
    try:
        number = int(code.strip(), 0)
    except ValueError:
        return None
    return _BY_NUMBER.get(number)


def level_for(code: str, handling: str | None = None) -> FaultLevel:
    """The level of `code`; a MindCluster `handling` strategy decides it when given."""
    if handling is not None:
        level = HANDLING_LEVELS.get(handling)
        if level is None:
            raise UnknownFaultCode(
                f"unknown fault handling {handling!r}; known: {', '.join(HANDLING_LEVELS)}"
            )
        return level
    entry = lookup(code)
    if entry is None:
        known = ", ".join(c.name + (f" ({c.number:#09x})" if c.number is not None else "") for c in CODES)
        raise UnknownFaultCode(f"fault code {code!r} is not in the table; give a level, or one of: {known}")
    return entry.level


def canonical(code: str) -> str:
    """The table's spelling of a known code (a numeric code becomes its name); else as given."""
    entry = lookup(code)
    return entry.name if entry is not None else code
