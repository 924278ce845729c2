"""Injected faults: what is active now, how `POST /admin/faults` changes it, how it fires.

A test double has to fail the way real engines do: a process that exits (after N requests,
or in the middle of a stream), a `/health` that hangs (for good, or for the next N
requests) or answers an HTTP error, 500s at some rate, slow tokens,
an unhealthy/dead fault-tolerance status, and a precision fault (NaN-like text).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import sys
from typing import Any

from simengine.options import FT_STATUSES, FaultSpec

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 3  # exit code after `crash_after` requests
MID_STREAM_EXIT_CODE = 4  # exit code when dying in the middle of a stream


class FaultError(ValueError):
    """A fault update that does not validate; the message names the field."""


def _check(field: str, value: Any) -> Any:
    if field in ("hang_health", "precision"):
        if not isinstance(value, bool):
            raise FaultError(f"{field} must be a boolean")
        return value
    if field == "hang_health_count":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise FaultError("hang_health_count must be a non-negative integer")
        return value
    if field == "health_status":
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 200 <= value <= 599
        ):
            raise FaultError("health_status must be an HTTP status (200-599) or null")
        return value
    if field in ("crash_after", "die_mid_stream", "end_stream_after"):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise FaultError(f"{field} must be a non-negative integer or null")
        return value
    if field == "error_rate":
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
            raise FaultError("error_rate must be a number in [0, 1]")
        return float(value)
    if field == "slow_tokens_ms":
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise FaultError("slow_tokens_ms must be a non-negative number")
        return float(value)
    if field == "ft_status":
        if value not in FT_STATUSES:
            raise FaultError(f"ft_status must be one of {list(FT_STATUSES)}")
        return value
    raise FaultError(
        f"unknown fault field {field!r}; known: {[f.name for f in dataclasses.fields(FaultSpec)]}"
    )


class Faults:
    """The live fault state of one engine."""

    def __init__(self, spec: FaultSpec, seed: int = 0) -> None:
        self.spec = spec
        self.answered = 0  # generation requests answered so far
        self.health_requests = 0  # /health requests seen (tests count retries with it)
        self._rng = random.Random(seed)

    def update(self, patch: Any) -> FaultSpec:
        """Apply a partial update (`{"reset": true}` first restores no faults)."""
        if not isinstance(patch, dict):
            raise FaultError("body must be a JSON object of fault fields")
        base = FaultSpec() if patch.get("reset") is True else self.spec
        changes = {k: _check(k, v) for k, v in patch.items() if k != "reset"}
        self.spec = dataclasses.replace(base, **changes)
        if "crash_after" in changes:
            self.answered = 0
        log.warning("faults now %s", self.spec)
        return self.spec

    def as_dict(self) -> dict[str, Any]:
        """The active faults as JSON-ready data."""
        return {
            **dataclasses.asdict(self.spec),
            "answered": self.answered,
            "health_requests": self.health_requests,
        }

    def health_fault(self) -> str | int | None:
        """What the next /health does: "hang", an HTTP status to answer, or None (healthy)."""
        self.health_requests += 1
        spec = self.spec
        if spec.hang_health:
            return "hang"
        if spec.hang_health_count > 0:
            self.spec = dataclasses.replace(spec, hang_health_count=spec.hang_health_count - 1)
            return "hang"
        return spec.health_status

    def roll_error(self) -> bool:
        """Whether this request should fail with an injected 500."""
        rate = self.spec.error_rate
        return rate > 0 and self._rng.random() < rate

    def on_answered(self) -> None:
        """Count one answered generation request; exit once `crash_after` is reached."""
        self.answered += 1
        limit = self.spec.crash_after
        if limit is not None and self.answered >= limit:
            # Let the loop hand the last response to the kernel before the process goes.
            asyncio.get_running_loop().call_soon(die, CRASH_EXIT_CODE, f"crash_after={limit} reached")

    def check_mid_stream(self, tokens_sent: int) -> None:
        """Exit when `die_mid_stream` tokens of a stream were sent."""
        limit = self.spec.die_mid_stream
        if limit is not None and tokens_sent >= limit:
            die(MID_STREAM_EXIT_CODE, f"die_mid_stream={limit} reached")

    def ends_early(self, tokens_sent: int) -> bool:
        """Whether a stream ends here without its finish reason (`end_stream_after`)."""
        limit = self.spec.end_stream_after
        return limit is not None and tokens_sent >= limit


def die(code: int, why: str) -> None:
    """Exit the process now, as a crashed engine would (no cleanup, no flush of state)."""
    print(f"builtin engine: injected fault: {why}; exiting with {code}", file=sys.stderr, flush=True)
    os._exit(code)
