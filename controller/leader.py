"""The leader lease: one key in the `motor_leader` KV bucket, whose TTL is the lease.

`create` wins an empty (or expired, or released) key; the holder renews with `update` at the
revision it last wrote, every TTL/5. A holder that cannot renew in time stops deciding before
its lease can have lapsed on the server (`valid`). Every decision it appends is fenced by the
sequence of its own `controller.leader_changed` (controller.appender), so even a write delayed
past that point fails once another controller has announced itself.

Nothing here raises: NATS slow or away is a failed try (the outcome of a write that timed out
is unknown, so a create that may have landed is adopted when the key turns out to be ours).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from streams.log import KV, WrongRevision

log = logging.getLogger(__name__)

LEASE_KEY = "leader"


@dataclass(frozen=True, slots=True)
class Holder:
    id: str
    term: int
    revision: int = 0


def lease_value(controller_id: str, term: int) -> bytes:
    """The lease key's value: who holds it, for which reign."""
    return orjson.dumps({"id": controller_id, "term": term})


def renew_every(ttl: float) -> float:
    """How often the holder renews: five tries before its own view of the lease runs out."""
    return ttl / 5


def poll_every(ttl: float) -> float:
    """How often a standby tries to take an expired or released lease."""
    return min(1.0, max(0.05, ttl / 10))


class Lease:
    """This controller's view of the lease; `acquire`/`renew` talk to the server."""

    def __init__(
        self, kv: KV, controller_id: str, ttl: float, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._kv = kv  # the `motor_leader` bucket
        self.id = controller_id
        self.ttl = ttl
        self.monotonic = monotonic
        self.term = 0
        self._revision: int | None = None
        self._valid_until = 0.0  # monotonic
        self._failing = False  # log a run of failures once

    async def kv(self) -> KV:
        return self._kv

    @property
    def held(self) -> bool:
        return self._revision is not None

    def valid(self, margin: float | None = None) -> bool:
        """Held and, by our clock, not yet lapsed on the server (minus a safety margin)."""
        margin = self.ttl * 0.2 if margin is None else margin
        return self.held and self.monotonic() < self._valid_until - margin

    def _value(self) -> bytes:
        return lease_value(self.id, self.term)

    def _failed(self, what: str, exc: BaseException) -> None:
        if not self._failing:
            log.warning("leader lease: %s failed (%s); trying again", what, exc or type(exc).__name__)
        self._failing = True

    def _ok(self, what: str) -> None:
        if self._failing:
            log.info("leader lease: %s works again", what)
        self._failing = False

    async def acquire(self, term: int) -> bool:
        """Take the lease if nobody else holds it; `term` is what the new reign will be called."""
        self.term = term
        sent = self.monotonic()
        try:
            kv = await self.kv()
            rev = await kv.create(LEASE_KEY, self._value())
        except WrongRevision:
            self._ok("create")
            # Ours after all when an earlier create timed out but landed, or when this id
            # held it in a previous life (a supervisor restarted us before the TTL ran out).
            holder = await self.holder()
            if holder is None or holder.id != self.id:
                return False
            log.info("leader lease: the key is already ours (revision %d); taking it up", holder.revision)
            self._revision = holder.revision
            return await self.renew()
        except Exception as exc:  # NATS slow or away: the outcome is unknown, try again later
            self._failed("create", exc)
            return False
        self._ok("create")
        self._revision, self._valid_until = rev, sent + self.ttl
        return True

    async def renew(self) -> bool:
        """Extend the lease; False (and no longer held) when someone else has it now."""
        if self._revision is None:
            return False
        sent = self.monotonic()
        try:
            kv = await self.kv()
            rev = await kv.update(LEASE_KEY, self._value(), last=self._revision)
        except WrongRevision:
            log.warning("leader lease lost: the key moved on (another controller took over)")
            self._revision = None
            return False
        except Exception as exc:
            # Unknown outcome: keep trying until the lease would lapse anyway.
            self._failed("renew", exc)
            if not self.valid(margin=0.0):
                self._revision = None
            return False
        self._ok("renew")
        self._revision, self._valid_until = rev, sent + self.ttl
        return True

    async def release(self) -> None:
        """Give the lease up now (clean shutdown), so a standby need not wait for the TTL."""
        rev, self._revision = self._revision, None
        if rev is None:
            return
        with contextlib.suppress(Exception):
            kv = await self.kv()
            await kv.delete(LEASE_KEY, last=rev)

    def drop(self) -> None:
        """Forget the lease without telling the server (it lapses by its TTL)."""
        self._revision = None

    async def holder(self) -> Holder | None:
        """Who holds the lease now, as the server says (None when free or unknown)."""
        try:
            kv = await self.kv()
            entry = await kv.get(LEASE_KEY)
        except Exception as exc:
            self._failed("read", exc)
            return None
        if entry is None or not entry.value:
            return None
        try:
            raw = orjson.loads(entry.value)
            return Holder(str(raw.get("id", "")), int(raw.get("term", 0)), int(entry.revision or 0))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return None
