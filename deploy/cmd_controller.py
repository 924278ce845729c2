"""`motor controller`: run one controller (leader or hot standby) with its HTTP API."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "controller",
        help="run a controller (decides; standbys take over when the leader's lease lapses)",
        description="Fold the log, hold or wait for the leader lease, decide and append decisions.",
    )
    p.add_argument("--config", help="cluster config file (YAML/JSON); default: the embedded default")
    p.add_argument("--nats-url", help="NATS URL(s), comma-separated; default: the config's nats.urls")
    p.add_argument("--id", default="c1", help="this controller's id, unique among controllers (default c1)")
    p.add_argument("--host", help="HTTP bind address; default: controller.host")
    p.add_argument("--port", type=int, help="HTTP port; default: controller.port")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from core.errors import ConfigError
    from core.subjects import check_token
    from deploy.common import load_config_file

    try:
        cfg = load_config_file(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        check_token(args.id, "--id")
    except ValueError as exc:
        print(f"motor controller: {exc}", file=sys.stderr)
        return 2
    port = args.port if args.port is not None else cfg.controller.port
    if not 0 <= port <= 65535:
        print(f"motor controller: --port {port} is not a port number (0-65535)", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s controller/{args.id} %(levelname)s %(name)s: %(message)s",
    )

    import uvicorn

    from controller.http import create_app
    from controller.service import ControllerService

    urls = [u.strip() for u in args.nats_url.split(",") if u.strip()] if args.nats_url else None
    service = ControllerService(cfg, controller_id=args.id, nats_urls=urls)
    failed: list[BaseException] = []

    def _failed(exc: BaseException) -> None:
        # Exit (non-zero) rather than serve a dead controller: a supervisor restarts it.
        failed.append(exc)
        server.should_exit = True

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(service, on_failure=_failed),
            host=args.host or cfg.controller.host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
    )
    server.run()
    if failed:
        print(f"motor controller: stopped: {failed[0]}", file=sys.stderr)
        return 1
    return 0
