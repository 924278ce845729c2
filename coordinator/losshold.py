"""What the coordinator keeps routing across a lost log while the new log re-adopts it.

After a purge or a delete-and-recreate of MOTOR, the node agents register again and re-assert
their READY engines, and the leading controller re-assembles each instance under its id: the
new log says INITIAL until that controller says ACTIVE again, a few seconds later. Folded on
top of the table, that INITIAL would make the whole fleet unroutable meanwhile (every client
got 503 `no routable instance`), although no engine changed. So an endpoint that was routable
when the log was lost stays routable while its instance is INITIAL in the new log, as long as
the same engine process serves it and the new log says nothing worse of it (DEAD, another
process, ISOLATED …); the node registering again (not yet in its instance, no endpoint
status yet) is part of the re-adoption too. Pure: the table asks, the coordinator's fold arms and releases it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.endpoint import Incarnation
from core.events import EndpointStatus, InstanceState


@dataclass
class LossHold:
    """The endpoints routable when the log was lost, each with the process that served it."""

    held: dict[str, Incarnation | None] = field(default_factory=dict)

    def bridges(
        self,
        key: str,
        incarnation: Incarnation | None,
        state: InstanceState,
        status: EndpointStatus | None,
        node_instance: int | None,
        instance_id: int,
    ) -> bool:
        """Whether `key`, unroutable by the new log alone, stays routable (see the module)."""
        if key not in self.held or self.held[key] != incarnation:
            return False
        if state not in _READOPTING:
            return False  # ISOLATED, RECOVERING …: a real decision about it
        # Registered again, the node is not yet in its instance and its endpoint not yet READY.
        return status in (None, EndpointStatus.READY) and node_instance in (None, instance_id)


# The states the re-adoption passes through (INITIAL), or was in before and after it.
_READOPTING = frozenset({InstanceState.INITIAL, InstanceState.ACTIVE, InstanceState.DEGRADED})
