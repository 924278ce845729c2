"""When this controller heard each node, on its own steady clock: the only basis of silence.

A heartbeat's `ts` is the sender's wall clock, and the controller's `now` is its own: judging
silence as one minus the other made a node whose clock runs an hour behind silent while it
beats, one an hour ahead never silent, and a controller whose clock steps forward terminate
every healthy instance (issue 24). So the live fold notes, per node, the controller's
monotonic reading when it folded that node's last heartbeat or registration (`note`), and
`decide` is handed those readings with the monotonic now (`Hearing`): no wall clock of any
machine enters the judgement.

The readings are this process's perception, not facts of the log, so they live beside the
state (`controller.fold.Fold.heard_at`), not in it: a checkpoint or a replay has none. A decide
given no `Hearing` (`motor replay --verify`, tools) judges nobody silent; the decisions that
rest on heartbeats say so in their reason and replay counts them apart (replay.verify).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.events import EventBase, Heartbeat, NodeDeregistered, NodeRegistered
from core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Hearing:
    """What the controller heard, every figure on its monotonic clock (seconds)."""

    now: float
    # Since when it could hear (caught up, reconnected, took over, the heartbeat stream
    # answered again): silence before it is the controller's deafness, not the node's.
    since: float = 0.0
    # The last moment heartbeats could land (the heartbeat stream's leader answered; None:
    # now): silence after it is the stream's election, not the node's (controller.hearing).
    until: float | None = None
    # node id -> when its last heartbeat or registration was folded; a node missing was never
    # heard by this process (it came from a checkpoint, or before a lost log).
    at: Mapping[str, float] = field(default_factory=dict)

    def quiet(self, node_id: str) -> float:
        """Seconds since the node was last heard (inf: never, by this process)."""
        last = self.at.get(node_id)
        return math.inf if last is None else self.now - last

    def judged(self, node_id: str) -> float:
        """Silence as far as it is the node's: not before `since`, not after `until`."""
        until = self.now if self.until is None else min(self.now, self.until)
        last = self.at.get(node_id, -math.inf)
        return max(0.0, min(until - last, self.now - self.since))


def note(heard: dict[str, float], state: ClusterState, event: EventBase, at: float) -> None:
    """Record in `heard` that `event`, just folded into `state`, was heard at `at`.

    Only a registration or a heartbeat of a node the state knows counts (a heartbeat of an
    unknown node is dropped by the reducer, and must not grow this map); a deregistered node
    is forgotten.
    """
    if isinstance(event, NodeRegistered | Heartbeat):
        node_id = event.data.node_id
        if node_id in state.nodes:
            heard[node_id] = at
    elif isinstance(event, NodeDeregistered):
        heard.pop(event.data.node_id, None)
