"""How much disk the log may take: MOTOR's `max_bytes` and the embedded server's store cap.

A full disk must never be where JetStream learns it is full: nats-server 2.15 on ENOSPC
answers no publish (the client times out) and keeps the stream in a write error until it is
restarted. So the limits sit below the disk and a write past them is refused with an error
that names the limit: MOTOR's `max_bytes` (discard new: "maximum bytes exceeded", and no
older event is dropped for it, which would lose acknowledged ones and look like a purge to
the lost-log check), inside the server's `max_file_store` ("insufficient resources"), which
leaves `headroom` for the heartbeat stream, the KV buckets and MOTOR_REQ (its own eighth).

`plan_store` is the pure rule `motor up` applies before it starts its server: the disk under
the store must hold the whole cap (what the store holds already counts as room), with a
margin for the server's own files and everything else on that disk; with `nats.max_bytes`
unset, MOTOR takes `DEFAULT_MAX_BYTES` or what the disk allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError

MiB = 1024 * 1024
GiB = 1024 * MiB
DEFAULT_MAX_BYTES = 1 * GiB  # years of events of a small cluster; heartbeats are not in MOTOR
MIN_MAX_BYTES = 1 * MiB
MIN_HEADROOM = 4 * MiB  # MOTOR_HB (one message a node) and the lease: a few KiB; a checkpoint
HEADROOM_FRACTION = 1 / 8  # checkpoints (4 kept) grow with the cluster, as MOTOR does
DISK_SHARE = 0.75  # of the room on the disk; the rest is for the server's files and the logs


REQUESTS_FRACTION = 1 / 8  # MOTOR_REQ, the coordinators' request records (oldest dropped first)
MIN_REQUESTS = 1 * MiB


def request_log_bytes(max_bytes: int) -> int:
    """MOTOR_REQ's `max_bytes` for a MOTOR of `max_bytes`: its own share of the store, so
    traffic history never takes the room the lifecycle log needs."""
    return max(MIN_REQUESTS, int(max_bytes * REQUESTS_FRACTION))


def headroom(max_bytes: int) -> int:
    """Room in the server's store beyond MOTOR: heartbeats, lease, checkpoints and MOTOR_REQ."""
    return max(MIN_HEADROOM, int(max_bytes * HEADROOM_FRACTION)) + request_log_bytes(max_bytes)


def store_cap(max_bytes: int) -> int:
    """The embedded server's `max_file_store` for a MOTOR of `max_bytes`."""
    return max_bytes + headroom(max_bytes)


@dataclass(frozen=True, slots=True)
class StorePlan:
    """MOTOR's `max_bytes` and the server's `max_file_store`, and the room they were fit in."""

    max_bytes: int
    max_file_store: int
    room: int  # free bytes on the store's disk plus what the store holds already


def plan_store(configured: int | None, *, free: int, used: int, where: str = "the store") -> StorePlan:
    """Fit the log into the disk: `configured` (nats.max_bytes) or the default, checked against
    `DISK_SHARE` of the room (`free` on the disk + `used` by the store); ConfigError if not."""
    room = free + used
    usable = int(room * DISK_SHARE)
    if configured is not None:
        cap = store_cap(configured)
        if cap > usable:
            raise ConfigError(
                f"nats.max_bytes {configured / MiB:.1f} MiB needs {cap / MiB:.1f} MiB of store under {where}, "
                f"but its disk has room for {usable / MiB:.1f} MiB ({DISK_SHARE:.0%} of "
                f"{room / MiB:.1f} MiB free or held by the store): free disk space or lower nats.max_bytes"
            )
        return StorePlan(configured, cap, room)
    fits = int(usable / (1 + HEADROOM_FRACTION + REQUESTS_FRACTION))
    max_bytes = min(DEFAULT_MAX_BYTES, fits, usable - MIN_HEADROOM - MIN_REQUESTS)
    while max_bytes > MIN_MAX_BYTES and store_cap(max_bytes) > usable:  # the minimums' rounding
        max_bytes -= MiB
    if max_bytes < MIN_MAX_BYTES:
        raise ConfigError(
            f"the disk under {where} has room for {usable / MiB:.1f} MiB of store "
            f"({room / MiB:.1f} MiB free or held by it): too little for the log; free disk space"
        )
    return StorePlan(max_bytes, store_cap(max_bytes), room)
