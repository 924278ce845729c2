"""The most output tokens a request may ask of a model: what its instances said they take.

A managed instance's nodes register their capacity (`max_seq_len`, which the node agent's
backend takes from the section's `engine_config`: vLLM/builtin `max_model_len`, SGLang
`context_length`); an instance refreshed from outside (seed 001) says `max_output_len` and
`max_seq_len` in its `static_info`. A model's limit is the largest any of its instances
declares (an engine still checks prompt plus output against its own context); a request
above it is refused before it costs an engine anything.
"""

from __future__ import annotations

from typing import Any

from coordinator.table import RoutingTable
from core.state import ClusterState


def model_limits(state: ClusterState) -> dict[str, int]:
    """Model -> the largest number of tokens any of its instances can produce."""
    out: dict[str, int] = {}

    def note(model: str, limit: int) -> None:
        if limit > out.get(model, 0):
            out[model] = limit

    for inst in state.instances.values():
        for member in inst.spec.members:
            node = state.nodes.get(member.node_id)
            if node is not None:
                note(inst.spec.model, node.reg.capacity.max_seq_len)
    for raw in state.external.values():
        limit = _external_limit(raw)
        if limit is not None:
            note(str(raw.get("model_name", "")), limit)
    return out


def _external_limit(raw: dict[str, Any]) -> int | None:
    static = raw.get("static_info")
    if not isinstance(static, dict):
        return None
    for key in ("max_output_len", "max_seq_len"):
        value = static.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class ModelLimits:
    """`model_limits` of a routing table's state, recomputed only when the log moved."""

    def __init__(self, table: RoutingTable) -> None:
        self.table = table
        self._seq = -1
        self._limits: dict[str, int] = {}

    def get(self, model: str | None) -> int | None:
        """The limit for `model` (None: the largest of all), or None when nothing says."""
        if self.table.last_seq != self._seq:
            self._limits = model_limits(self.table.state)
            self._seq = self.table.last_seq
        if model is None:
            return max(self._limits.values(), default=None)
        return self._limits.get(model)
