"""Payloads of fleet-wide engine operations and LoRA adapters, carried through the log.

`motor fleet flush-cache|pause|continue|reload-weights|sleep|wake --model M` and `motor lora
load|unload` append `operator.fleet_op_requested`; the leading controller sends one
`command.engine_op` to every node serving an instance of the model
(`controller.fleetop_rules`); each node agent calls its engines' native route
(`nodeagent.engine_ops`) and answers `node.engine_op_completed` with one result per engine;
the controller closes the operation with `controller.fleet_op_completed`, a summary.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from core.bounds import Count, Duration, EndpointId, InstanceId, Term
from core.eventdata import Frozen

FleetOpName = Literal[
    "flush-cache", "pause", "continue", "reload-weights", "sleep", "wake", "lora-load", "lora-unload"
]
FLEET_OPS: tuple[str, ...] = (
    "flush-cache", "pause", "continue", "reload-weights", "sleep", "wake", "lora-load", "lora-unload",
)  # fmt: skip
# What an engine reports of one operation: done, not offered by its engine kind, or tried and failed.
Outcome = Literal["ok", "unsupported", "failed"]
# Checked where it is typed (`motor lora`); the log stays a tolerant reader (an empty one is a
# failed result on the node: `nodeagent.engine_ops.needs`).
AdapterName = Annotated[str, Field(max_length=200)]
SleepLevel = Annotated[int, Field(ge=1, le=2)]


class FleetOpArgs(Frozen):
    """What an operation needs beyond its name (each op reads its own)."""

    path: str | None = None  # reload-weights: the weights to load; lora-load: the adapter's
    lora_name: AdapterName | None = None  # lora-load, lora-unload
    level: SleepLevel = 1  # sleep: vLLM's level (SGLang releases all it can)


class FleetOpRequestedData(Frozen):
    """Run `op` on every engine of every instance of `model`."""

    op_id: str
    op: FleetOpName
    model: str
    args: FleetOpArgs = FleetOpArgs()
    reason: str = ""
    requested_by: str = "operator"
    # Only this instance of the model (the controller's: a wanted adapter for a new instance).
    instance_id: InstanceId | None = None


class EngineOpCommandData(Frozen):
    """To one node: run `op` on its engines (the instance's), answer `node.engine_op_completed`."""

    command_id: str
    node_id: str
    instance_id: InstanceId | None = None
    op_id: str
    op: FleetOpName
    args: FleetOpArgs = FleetOpArgs()
    reason: str = ""
    term: Term = 0


class EngineOpResult(Frozen):
    endpoint_id: EndpointId
    outcome: Outcome
    status: Annotated[int, Field(ge=100, le=599)] | None = None  # the engine's HTTP status, when it answered
    detail: str = ""


class EngineOpCompletedData(Frozen):
    """A node's answer to `command.engine_op`: one result per engine it ran."""

    command_id: str
    op_id: str
    node_id: str
    instance_id: InstanceId | None = None
    op: FleetOpName
    args: FleetOpArgs = FleetOpArgs()
    results: tuple[EngineOpResult, ...] = ()
    refused: str = ""  # "code: reason" when the node did not run it at all (stale term, ...)


class FleetOpCompletedData(Frozen):
    """The summary: how many engines did it, lacked it, failed it; nodes that never answered."""

    op_id: str
    op: FleetOpName
    model: str
    ok: Count = 0
    unsupported: Count = 0
    failed: Count = 0
    unanswered: tuple[str, ...] = ()  # node ids
    took: Duration = 0.0
    reason: str = ""
