"""The leader lease: one key in the `motor_leader` KV bucket, whose TTL is the lease.

`create` wins an empty (or expired, or released) key; the holder renews with `update` at the
revision it last wrote, every TTL/2. A holder that cannot renew in time stops deciding before
its lease can have lapsed on the server (`valid`), and every decision it appends is guarded by
expected-last-subject-sequence anyway, so a late write of a deposed leader fails.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import orjson
from nats.js import JetStreamContext
from nats.js.errors import Error as JsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from streams.definitions import LEADER_BUCKET

log = logging.getLogger(__name__)

LEASE_KEY = "leader"


@dataclass(frozen=True, slots=True)
class Holder:
    id: str
    term: int


class Lease:
    """This controller's view of the lease; `acquire`/`renew` talk to the server."""

    def __init__(self, js: JetStreamContext, controller_id: str, ttl: float) -> None:
        self.js = js
        self.id = controller_id
        self.ttl = ttl
        self.term = 0
        self._kv: KeyValue | None = None
        self._revision: int | None = None
        self._valid_until = 0.0  # monotonic

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(LEADER_BUCKET)
        return self._kv

    @property
    def held(self) -> bool:
        return self._revision is not None

    def valid(self, margin: float | None = None) -> bool:
        """Held and, by our clock, not yet lapsed on the server (minus a safety margin)."""
        margin = self.ttl * 0.2 if margin is None else margin
        return self.held and time.monotonic() < self._valid_until - margin

    def _value(self) -> bytes:
        return orjson.dumps({"id": self.id, "term": self.term})

    async def acquire(self, term: int) -> bool:
        """Take the lease if nobody holds it; `term` is what the new reign will be called."""
        kv = await self.kv()
        self.term = term
        sent = time.monotonic()
        try:
            rev = await kv.create(LEASE_KEY, self._value())
        except KeyWrongLastSequenceError:
            return False
        except JsError as exc:
            log.warning("leader lease: create failed: %s", exc)
            return False
        self._revision, self._valid_until = rev, sent + self.ttl
        return True

    async def renew(self) -> bool:
        """Extend the lease; False (and no longer held) when someone else has it now."""
        if self._revision is None:
            return False
        kv = await self.kv()
        sent = time.monotonic()
        try:
            rev = await kv.update(LEASE_KEY, self._value(), last=self._revision)
        except KeyWrongLastSequenceError:
            log.warning("leader lease lost: the key moved on (another controller took over)")
            self._revision = None
            return False
        except JsError as exc:
            # Unknown outcome: keep trying until the lease would lapse anyway.
            log.warning("leader lease: renew failed: %s", exc)
            if not self.valid(margin=0.0):
                self._revision = None
            return False
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

    async def holder(self) -> Holder | None:
        """Who holds the lease now, as the server says."""
        kv = await self.kv()
        try:
            entry = await kv.get(LEASE_KEY)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        raw = orjson.loads(entry.value)
        return Holder(str(raw.get("id", "")), int(raw.get("term", 0)))
