"""Payloads of the operator's lifecycle requests: drain, uncordon, scale, rolling restart.

An operator (`motor drain`, `motor scale`, `motor restart --rolling`) appends a request; the
leading controller turns it into commands (`controller.operation_rules`), so what happened is
read from the log like every other decision. Frozen and tolerant like `core.eventdata`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from core.bounds import MAX_COUNT, Duration, InstanceId
from core.eventdata import Frozen, Role

# Seconds an instance may take to finish what it carries before its engines are stopped anyway.
DrainTimeout = Annotated[float, Field(ge=0.0, le=86400.0, allow_inf_nan=False)]


class DrainRequestedData(Frozen):
    """Take an instance (or the instance on a node) out of routing, let it finish, stop it.

    A node drain also cordons the node: no new instance is assembled on it until
    `operator.uncordoned`. An instance drain leaves its nodes free: the controller assembles a
    fresh instance on them when the config (or `motor scale`) still wants one.
    """

    drain_id: str
    target: Literal["instance", "node"]
    instance_id: InstanceId | None = None
    node_id: str | None = None
    timeout: DrainTimeout = 30.0
    reason: str = ""
    requested_by: str = "operator"
    rollout_id: str | None = None  # the rolling restart this drain is a step of
    cordon: bool = True  # a node drain's cordon; a node agent stopping on SIGTERM sets none

    @property
    def entity(self) -> str:
        """Its subject's entity: the node (a node agent may publish only its own), or `i<id>`."""
        return self.node_id if self.target == "node" and self.node_id else f"i{self.instance_id}"


class UncordonedData(Frozen):
    node_id: str
    reason: str = ""
    requested_by: str = "operator"


class ScaleRequestedData(Frozen):
    """Run `instances` instances of `role` from now on (the config's count until then)."""

    role: Role
    instances: Annotated[int, Field(ge=0, le=MAX_COUNT)]
    reason: str = ""
    requested_by: str = "operator"


class RolloutRequestedData(Frozen):
    """Replace every instance of `model` assembled before this request, one at a time."""

    rollout_id: str
    model: str
    timeout: DrainTimeout = 30.0  # each old instance's drain
    reason: str = ""
    requested_by: str = "operator"


class RolloutCompletedData(Frozen):
    rollout_id: str
    model: str
    replaced: tuple[InstanceId, ...] = ()
    took: Duration = 0.0
    reason: str = ""
