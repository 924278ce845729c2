"""`motor nodeagent`: run the node agent of one node (registers, runs engines, reports).

Every flag has an environment fallback (`MOTOR_NODE_ID`, `MOTOR_ROLE`, ...), so a pod spec
can set them once; defaults come from the config's `nodeagent` section.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

ENV = {
    "config": "MOTOR_CONFIG",
    "node_id": "MOTOR_NODE_ID",
    "role": "MOTOR_ROLE",
    "nats_url": "MOTOR_NATS_URL",
    "ip": "MOTOR_POD_IP",
    "host": "MOTOR_NODEAGENT_HOST",
    "port": "MOTOR_NODEAGENT_PORT",
    "engine_port_base": "MOTOR_ENGINE_PORT_BASE",
    "devices": "MOTOR_DEVICES",
    "device_env": "MOTOR_DEVICE_ENV",
    "job_name": "MOTOR_JOB_NAME",
    "log_dir": "MOTOR_LOG_DIR",
    "run_dir": "MOTOR_RUN_DIR",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "nodeagent",
        help="run the node agent of one node",
        description="Register this node, run its start/stop commands, supervise engines, report.",
    )
    p.add_argument(
        "--config", help="cluster config file (YAML/JSON); default: the embedded default [MOTOR_CONFIG]"
    )
    p.add_argument("--node-id", help="this node's id, a subject token (A-Z a-z 0-9 _ -) [MOTOR_NODE_ID]")
    p.add_argument(
        "--role", choices=["union", "prefill", "decode"], help="engine section to run [MOTOR_ROLE]"
    )
    p.add_argument("--nats-url", help="NATS URL(s), comma-separated; default: the config's [MOTOR_NATS_URL]")
    p.add_argument("--ip", help="pod IP engines bind and register on; default: nodeagent.host [MOTOR_POD_IP]")
    p.add_argument("--host", help="bind address of the agent's HTTP; default: --ip [MOTOR_NODEAGENT_HOST]")
    p.add_argument(
        "--port", type=int, help="the agent's HTTP port (0: any free); default: nodeagent.port_base"
    )
    p.add_argument(
        "--engine-port-base", type=int, help="first engine business port; default: nodeagent.engine_port_base"
    )
    p.add_argument("--devices", help="devices of this node, e.g. 0,1,2,3 (split evenly over endpoints)")
    p.add_argument(
        "--device-env",
        choices=["CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"],
        help="pinning variable; default: ASCEND_RT_VISIBLE_DEVICES when /dev/davinci_manager exists",
    )
    p.add_argument(
        "--job-name", help="job this node belongs to; default: nodeagent.job_name [MOTOR_JOB_NAME]"
    )
    p.add_argument("--log-dir", help="engine logs go here; default: nodeagent.log_dir [MOTOR_LOG_DIR]")
    p.add_argument("--run-dir", help="run state (for restarts); default: <log-dir>/../run [MOTOR_RUN_DIR]")
    p.add_argument(
        "--keep-engines", action="store_true", help="leave engines running on exit (for an upgrade)"
    )
    p.add_argument(
        "--resync-interval", type=float, default=5.0, help="seconds between log/ground-truth checks"
    )
    p.add_argument(
        "--fault-poll-interval",
        type=float,
        default=None,
        help="seconds between /fault_tolerance/status polls; default: the section's fault_tolerance.poll_interval",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=_run)


def _env_fill(args: argparse.Namespace) -> None:
    for attr, var in ENV.items():
        if getattr(args, attr, None) is None and os.environ.get(var):
            setattr(args, attr, os.environ[var])


def _int(value: Any, flag: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SystemExit(f"motor nodeagent: {flag} must be an integer, got {value!r}") from None


def _default_devices(cfg: Any, role: Any) -> tuple[str, ...]:
    section = cfg.section(role)
    n = section.devices_per_node if section is not None else 0
    return tuple(str(i) for i in range(n))


def _restored_urls(cfg: Any, role: Any, pod_ip: str, urls: list[str] | None) -> list[str] | None:
    """NATS URLs for a container restored from a snapshot: cluster DNS moved to its namespace."""
    from nodeagent.snapshot import Snapshot, with_namespace

    section = cfg.section(role)
    if section is None or not section.snapshot.enabled:
        return urls
    snap = Snapshot(section.snapshot, pod_ip, lambda phase, meta: None, lambda: False)
    namespace = snap.restored_namespace()
    if namespace is None:
        return urls
    return with_namespace(urls or list(cfg.nats.urls), namespace)


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    from pathlib import Path

    from core.errors import ConfigError, SubjectError
    from core.events import Role
    from deploy.common import load_config_file
    from nodeagent.agent import NodeAgent
    from nodeagent.errors import StartupError
    from nodeagent.settings import ASCEND_ENV, CUDA_ENV, AgentSettings, parse_devices

    _env_fill(args)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.node_id:
        print("motor nodeagent: --node-id (or MOTOR_NODE_ID) is required", file=sys.stderr)
        return 2
    if not args.role:
        print(
            "motor nodeagent: --role (or MOTOR_ROLE) is required: union, prefill or decode", file=sys.stderr
        )
        return 2
    try:
        cfg = load_config_file(args.config)
        na = cfg.nodeagent
        device_env = args.device_env or (ASCEND_ENV if os.path.exists("/dev/davinci_manager") else CUDA_ENV)
        log_dir = Path(args.log_dir or na.log_dir)
        nats_urls = [u.strip() for u in args.nats_url.split(",") if u.strip()] if args.nats_url else None
        nats_urls = _restored_urls(cfg, Role(args.role), args.ip or na.host, nats_urls)
        settings = AgentSettings(
            config=cfg,
            node_id=args.node_id,
            role=Role(args.role),
            ip=args.ip or na.host,
            host=args.host,
            port=_int(args.port if args.port is not None else na.port_base, "--port"),
            engine_port_base=_int(
                args.engine_port_base if args.engine_port_base is not None else na.engine_port_base,
                "--engine-port-base",
            ),
            # Without --devices, a section's devices_per_node (MindIE `*_pod_npu_num`) pins 0..n-1.
            devices=parse_devices(args.devices) or _default_devices(cfg, Role(args.role)),
            job_name=args.job_name or na.job_name,
            log_dir=log_dir,
            run_dir=Path(args.run_dir) if args.run_dir else None,
            nats_urls=nats_urls,
            device_env=device_env,
            keep_engines=args.keep_engines,
            resync_interval=args.resync_interval,
            fault_poll_interval=args.fault_poll_interval,
        )
        from core import subjects

        subjects.check_token(settings.node_id, "--node-id")
    except (ConfigError, StartupError, SubjectError, ValueError) as exc:
        print(f"motor nodeagent: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await NodeAgent(settings).run(stop)

    try:
        return asyncio.run(main())
    except StartupError as exc:
        print(f"motor nodeagent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"motor nodeagent: {exc}", file=sys.stderr)
        return 1
