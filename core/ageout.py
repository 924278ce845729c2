"""When facts are said again so that MOTOR's age-out never takes what a fresh fold needs.

MOTOR keeps each message `nats.max_age_days`. Whoever owns a long-lived fact says it again
once its newest statement is `RESTATE_AT` of that age: the controller its instances
(`controller.restate`), each node agent its registration and endpoint statuses
(`nodeagent.resync`). Half leaves the other half for a restater that was away (a leader
election, a NATS outage) to catch up before anything is lost.
"""

from __future__ import annotations

from core.config import NatsConfig

DAY = 86400.0
RESTATE_AT = 0.5


def max_age_seconds(cfg: NatsConfig) -> float:
    """MOTOR's max_age in seconds, as the config sets it."""
    return cfg.max_age_days * DAY


def restate_due(stated_at: float, now: float, max_age: float) -> bool:
    """Whether a fact last stated at `stated_at` must be said again at `now` (max_age 0: never)."""
    return max_age > 0 and now - stated_at >= max_age * RESTATE_AT
