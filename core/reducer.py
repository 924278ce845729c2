"""apply(state, event) -> state: the pure fold every component and the replay tool share.

No clock reads: time comes from `event.ts`. Events about unknown entities are no-ops (a
heartbeat before its registration, a command for a node that left), never errors, so a
replay of any log prefix succeeds. Handlers are total over what the codec accepts: a
decodable event never raises here (the folds still guard `apply` and count what does as
`inapplicable`, so a bug here costs one event, not the fold).
"""

from __future__ import annotations

from collections.abc import Iterable

from core.events import ALL_EVENTS, EventBase
from core.fastreplace import replace
from core.handlers import HANDLERS, commands, faults, fleetops, instances, nodes, operations
from core.state import ClusterState

# Every handler module registers its handlers as it is imported; a new event class without a
# handler would stop every fold at its first event.
HANDLER_MODULES = (nodes, commands, instances, faults, operations, fleetops)
_unhandled = [cls.__name__ for cls in ALL_EVENTS if cls not in HANDLERS]
if _unhandled:
    raise TypeError(f"no reducer handler for {', '.join(_unhandled)}")


def apply(state: ClusterState, event: EventBase, seq: int = 0) -> ClusterState:
    """Return the state after `event` (at stream sequence `seq`, 0 when unknown)."""
    changes = HANDLERS[type(event)](state, event, seq)
    if changes is None:
        changes = {}
    changes["last_seq"] = max(state.last_seq, seq)
    changes["last_ts"] = max(state.last_ts, event.ts)
    changes["events_applied"] = state.events_applied + 1
    return replace(state, **changes)


def fold(events: Iterable[tuple[int, EventBase]], state: ClusterState | None = None) -> ClusterState:
    """Fold `(seq, event)` pairs into a state."""
    s = state if state is not None else ClusterState()
    for seq, ev in events:
        s = apply(s, ev, seq)
    return s
