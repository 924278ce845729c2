"""`motor wait-idle`: wait until a coordinator has no request in flight (a Kubernetes PreStop).

A coordinator's SIGTERM closes every connection at once. Kubernetes removes a terminating
pod from its Service while the PreStop hook runs, so this waits `--settle` seconds for that
removal to reach every proxy (new requests now go to other replicas; this one still serves),
then polls the coordinator's `/metrics` until the requests it has in flight
(`motor_coordinator_endpoint_inflight`, summed) are done, or `--timeout` passes. It never
touches the coordinator: the SIGTERM after it does the stopping.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

INFLIGHT = "motor_coordinator_endpoint_inflight"
ADMIN_KEYS_ENV = "MOTOR_COORDINATOR_ADMIN_KEYS"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "wait-idle",
        help="wait until a coordinator has no request in flight (Kubernetes PreStop)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", default="http://127.0.0.1:8000/metrics", help="the coordinator's /metrics")
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds to wait before the first look (default 5)"
    )
    p.add_argument("--timeout", type=float, default=40.0, help="give up after this many seconds (default 40)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between looks (default 0.5)")
    p.set_defaults(func=_run)


def in_flight(text: str) -> int:
    """Requests in flight in a coordinator's Prometheus text (every endpoint summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == INFLIGHT:
            total += sum(s.value for s in family.samples)
    return int(total)


def _fetch(url: str, key: str | None) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode("utf-8", errors="replace")  # type: ignore[no-any-return]


def wait_idle(
    read: Callable[[], str],
    *,
    settle: float,
    timeout: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, int]:
    """(idle, last count): poll `read` until nothing is in flight or `timeout` passes."""
    deadline = clock() + timeout
    sleep(min(settle, timeout))
    while True:
        n = in_flight(read())
        if n == 0:
            return True, 0
        if clock() >= deadline:
            return False, n
        sleep(interval)


def _run(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--settle", args.settle),
        ("--timeout", args.timeout),
        ("--interval", args.interval),
    ):
        if value < 0 or (flag == "--interval" and value == 0):
            print(
                f"motor wait-idle: {flag} must be {'positive' if flag == '--interval' else '>= 0'}",
                file=sys.stderr,
            )
            return 2
    # /metrics needs an admin key only when public_metrics is off; the pod has the keys in its env.
    keys = [k.strip() for k in os.environ.get(ADMIN_KEYS_ENV, "").replace("\n", ",").split(",") if k.strip()]
    key = keys[0] if keys else None
    started = time.monotonic()
    try:
        idle, n = wait_idle(
            lambda: _fetch(args.url, key), settle=args.settle, timeout=args.timeout, interval=args.interval
        )
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"motor wait-idle: cannot read {args.url}: {exc}", file=sys.stderr)
        return 1
    took = time.monotonic() - started
    if not idle:
        print(f"motor wait-idle: {n} requests still in flight after {took:.1f} s", file=sys.stderr)
        return 1
    print(f"motor wait-idle: no request in flight after {took:.1f} s", file=sys.stderr)
    return 0
