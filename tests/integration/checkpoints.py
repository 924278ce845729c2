"""A stored controller checkpoint read back by a test: its state alone (the controller reads
it with the log it came from, `streams.checkpoint.load_checkpoint_origin`)."""

from __future__ import annotations

from core.state import ClusterState
from streams.checkpoint import load_checkpoint_origin
from streams.log import Log


async def load_checkpoint(log: Log, key: str) -> ClusterState | None:
    """The state of the last checkpoint under `key`, or None if there is none."""
    found = await load_checkpoint_origin(log, key)
    return found[0] if found is not None else None
