"""Restating live instances before MOTOR's age-out takes the facts that define them.

MOTOR keeps events for `nats.max_age_days`. An instance that simply lives longer than that
would vanish from every fold that starts from the log alone (a fresh coordinator, `motor
status`, `motor replay`): its `instance.assembled` and the state change that made it ACTIVE
age out while its engines serve. So once the newest statement of an instance (its assembly,
or its last restatement) is `core.ageout.RESTATE_AT` of `max_age` old, the leader appends an
`instance.restated` carrying the spec and the state as its fold holds them. The reducer makes
it a no-op for a fold that knows the instance (only `restated_ts` moves) and the whole
instance for one that does not; it sends no command, so one start per incarnation stands.

The node agents own their facts (registration, endpoint statuses) and restate them on the same
schedule (`nodeagent.resync`). Pure, like every rule: `now` and the config are given, so
`motor replay --verify` re-derives each restatement. At most `RESTATE_PER_TICK` a call, oldest
first: a fleet assembled in one go comes due in one go, and must not land as one burst.
"""

from __future__ import annotations

from controller.rule_context import Cause, Ctx, Decision
from core.ageout import max_age_seconds, restate_due
from core.state import InstanceRecord

RESTATE_PER_TICK = 64


def stated_ts(inst: InstanceRecord) -> float:
    """When the log last said what the instance is (its assembly or its last restatement)."""
    return max(inst.assembled_ts, inst.restated_ts)


def restate(ctx: Ctx, busy: set[int]) -> list[Decision]:
    """`instance.restated` for the instances (none of `busy`) whose facts are due, oldest first."""
    max_age = max_age_seconds(ctx.cfg.nats)
    due = sorted(
        (stated_ts(inst), iid)
        for iid, inst in ctx.state.instances.items()
        if iid not in busy and restate_due(stated_ts(inst), ctx.now, max_age)
    )
    out: list[Decision] = []
    for stated, iid in due[:RESTATE_PER_TICK]:
        inst = ctx.state.instances[iid]
        why = (
            f"restating instance {iid} ({inst.state.value}): last stated {ctx.now - stated:.0f}s ago, "
            f"MOTOR ages events out after {max_age:g}s"
        )
        out.append(ctx.restated(inst, Cause(inst.assembled_seq, inst.assembled_id, why)))
    return out
