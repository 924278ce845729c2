"""The coordinator's readiness: a table that once held the log keeps serving across a lost log."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from coordinator.context import CoordinatorContext
from core.events import Role
from tests.unit.coord_events import instance_events


@dataclass
class Fold:
    caught_up_once: bool

    async def wait_for(self, seq: int, within: float) -> bool:
        return True


def routed_ctx() -> CoordinatorContext:
    ctx = CoordinatorContext()
    for seq, event in enumerate(instance_events(1, Role.UNION), start=1):
        ctx.apply(event, seq)
    return ctx


@pytest.mark.parametrize(
    ("caught_up", "fold", "ready", "reason"),
    [
        (False, None, False, "replaying the event log"),
        (False, Fold(caught_up_once=False), False, "replaying the event log"),  # first replay
        (True, Fold(caught_up_once=True), True, ""),
        # The fold starts over after a lost log: the table it built keeps serving meanwhile.
        (False, Fold(caught_up_once=True), True, ""),
    ],
)
def test_readiness_follows_whether_the_table_ever_held_the_log(
    caught_up: bool, fold: Fold | None, ready: bool, reason: str
) -> None:
    ctx = routed_ctx()
    ctx.log = fold
    if caught_up:
        ctx.caught_up.set()
    assert ctx.readiness() == (ready, reason)


def test_a_draining_replica_is_not_ready() -> None:
    ctx = routed_ctx()
    ctx.log = Fold(caught_up_once=True)
    ctx.caught_up.set()
    assert ctx.readiness() == (True, "")
    ctx.draining = True  # SIGTERM: a load balancer must send it nothing new
    ready, reason = ctx.readiness()
    assert not ready and reason.startswith("draining")
