"""`motor coordinator --config FILE`: run one coordinator replica (OpenAI API + management)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from deploy.liveness import MAX_UNIX_PATH


def register(sub: Any) -> None:
    p = sub.add_parser("coordinator", help="run a coordinator: the OpenAI endpoint in front of the engines")
    p.add_argument("--config", help="cluster config file (YAML or JSON); default: the embedded default")
    p.add_argument("--nats-url", help="NATS server URL(s), comma-separated; default: the config's nats.urls")
    p.add_argument("--host", help="address to listen on (default: coordinator.host)")
    p.add_argument("--port", type=int, help="port to listen on, 0 for a free one (default: coordinator.port)")
    p.add_argument("--mgmt-port", type=int, help="management API port (default: coordinator.mgmt_port)")
    p.add_argument("--name", default="coordinator", help="replica name (NATS client name, event source)")
    p.add_argument(
        "--reuse-port",
        action="store_true",
        help="listen with SO_REUSEPORT, so several replicas share one port (motor up --coordinators N)",
    )
    p.add_argument(
        "--probe-socket",
        metavar="PATH",
        help="also serve the management API (/liveness for the supervisor's probe) on this Unix "
        "socket, this replica's own when replicas share the port (motor up sets it)",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from core.errors import ConfigError
    from deploy.common import load_config_file

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = load_config_file(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    for flag, value in (("--port", args.port), ("--mgmt-port", args.mgmt_port)):
        if value is not None and not 0 <= value <= 65535:
            print(f"{flag}: {value} is not a port (0-65535)", file=sys.stderr)
            return 2
    if args.probe_socket is not None and len(os.fsencode(args.probe_socket)) > MAX_UNIX_PATH:
        print(
            f"--probe-socket: {args.probe_socket} is longer than a Unix socket path may be "
            f"({MAX_UNIX_PATH} bytes); choose a shorter one",
            file=sys.stderr,
        )
        return 2

    from coordinator.service import CoordinatorService, run
    from streams.connection import NatsOptions
    from streams.errors import StreamsError

    urls = [u.strip() for u in args.nats_url.split(",") if u.strip()] if args.nats_url else None
    nats = NatsOptions.from_config(cfg.nats, urls=urls)
    service = CoordinatorService(
        cfg.coordinator,
        nats,
        host=args.host,
        port=args.port,
        mgmt_port=args.mgmt_port,
        name=args.name,
        reuse_port=args.reuse_port,
        probe_socket=args.probe_socket,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(service, stop)

    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # no uvloop on this platform: the stdlib loop works, only slower
        runner = asyncio.run
    try:
        runner(main())
    except (StreamsError, OSError) as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    return 0
