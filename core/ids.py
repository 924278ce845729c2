"""Identifiers: random ids for facts, derived ids for decisions.

A decision's id is derived from what it answers, so two controllers (or one controller
replaying) that reach the same decision produce the same `Nats-Msg-Id` and JetStream's
dedupe window drops the second copy.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import time
from collections.abc import Callable, Iterator

# Set only by the seeded simulator (tests/sim), which runs every component in one process and
# must repeat a run exactly from its seed: then every fresh id of this context is drawn there.
_SOURCE: contextvars.ContextVar[Callable[[], str] | None] = contextvars.ContextVar(
    "motor_new_id", default=None
)


@contextlib.contextmanager
def ids_from(source: Callable[[], str]) -> Iterator[None]:
    """Draw every `new_id()` in this context (and in the tasks started from it) from `source`."""
    token = _SOURCE.set(source)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def new_id() -> str:
    """A fresh, time-ordered 128-bit id as 32 hex digits (UUIDv7 layout)."""
    source = _SOURCE.get()
    if source is not None:
        return source()
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | (rand & ((1 << 76) - 1))
    return f"{value:032x}"


def derive_id(*parts: object) -> str:
    """A stable 128-bit id from its parts (same parts, same id)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(str(part).encode())
        h.update(b"\x1f")
    return h.hexdigest()


def room_id(pair_id: str, attempt: int) -> int:
    """SGLang `bootstrap_room`: a stable non-negative 63-bit hash of pair id and attempt."""
    digest = hashlib.blake2b(f"{pair_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)
