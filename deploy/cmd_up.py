"""`motor up`: the local cluster on the embedded defaults; `motor status`: its table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from deploy.common import add_nats_args, load_config_file, nats_options, unreachable_hint

MAX_NATS_CLUSTER = 7  # JetStream streams hold at most 5 replicas; more servers only spread load
PLACEMENT_EVERY = 2.0  # seconds between asks of who leads the MOTOR stream


def register(sub: Any) -> None:
    from deploy.logcap import DEFAULT_LOG_MAX

    up = sub.add_parser("up", help="run a local cluster (nats-server, controllers, coordinator, node agents)")
    up.add_argument(
        "--config",
        help="cluster config (YAML/JSON, or a MindIE-Motor user_config.json); "
        "default: one union instance and a 1P1D pair",
    )
    up.add_argument("--env", help="the env.json of a MindIE-Motor user_config.json (engine environment)")
    up.add_argument(
        "--nodes", type=int, default=None, help="node agents to run (default: what the config needs)"
    )
    up.add_argument(
        "--nats-url",
        default=None,
        help="use this external NATS instead of starting one; every process logs in with the "
        "credentials of the environment (MOTOR_NATS_CONTEXT, MOTOR_NATS_USER/PASSWORD, MOTOR_NATS_CREDS)",
    )
    up.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="run a JetStream cluster of N nats-servers (routes between them, streams at replicas N, "
        "each store under <root>/nats/nN/); default 1",
    )
    up.add_argument(
        "--nats-port",
        type=int,
        default=4222,
        metavar="PORT",
        help="client port of the embedded nats-server (member i of a cluster: PORT+i; routes on "
        "PORT+2000+i, monitoring on PORT+4000+i); default %(default)s",
    )
    up.add_argument("--root", default=".motor", help="state dir: NATS data, logs (default %(default)s)")
    up.add_argument("--no-live", action="store_true", help="print status lines instead of a live table")
    up.add_argument("--no-standby", action="store_true", help="run one controller only")
    up.add_argument(
        "--coordinators",
        type=int,
        default=1,
        metavar="N",
        help="coordinator replicas sharing the coordinator port (SO_REUSEPORT); default 1",
    )
    up.add_argument(
        "--no-restart",
        action="store_true",
        help="leave a crashed process down instead of restarting it with backoff (and leave a "
        "coordinator that stops answering alone too)",
    )
    from deploy.liveness import LivenessRule

    rule = LivenessRule()
    up.add_argument(
        "--liveness-interval",
        type=float,
        default=rule.interval,
        metavar="S",
        help="probe each coordinator replica's /liveness on its own socket every S seconds; "
        "default %(default)s",
    )
    up.add_argument(
        "--liveness-timeout",
        type=float,
        default=rule.timeout,
        metavar="S",
        help="a probe unanswered after S seconds is a miss; default %(default)s",
    )
    up.add_argument(
        "--liveness-misses",
        type=int,
        default=rule.misses,
        metavar="K",
        help="K misses in a row (frozen or wedged) kill the replica, taking it out of the shared "
        "port, and the supervisor starts a fresh one; default %(default)s",
    )
    up.add_argument(
        "--log-max-mb",
        type=float,
        default=DEFAULT_LOG_MAX / 2**20,
        metavar="MB",
        help="cut each log under <root>/logs past MB MiB, its older part kept as <name>.log.1 "
        "(0: never); default %(default)g",
    )
    up.set_defaults(func=_up)
    st = sub.add_parser("status", help="print the cluster table from the log of a running cluster")
    add_nats_args(st)
    st.set_defaults(func=_status)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _up(args: argparse.Namespace) -> int:
    from core.errors import ConfigError

    try:
        cfg = load_config_file(args.config, args.env)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from deploy.cluster import LocalCluster
    from deploy.clusterplan import NATS_MONITOR_OFFSET, NATS_ROUTE_OFFSET, Ports
    from deploy.liveness import LivenessRule
    from deploy.localports import one_machine_ports

    try:
        liveness = LivenessRule(args.liveness_interval, args.liveness_timeout, args.liveness_misses)
    except ValueError as exc:
        print(f"motor up: {exc}", file=sys.stderr)
        return 2

    if args.coordinators < 1:
        print(f"motor up: --coordinators: at least 1, got {args.coordinators}", file=sys.stderr)
        return 2
    if args.nats_cluster < 1 or args.nats_cluster > MAX_NATS_CLUSTER:
        print(
            f"motor up: --nats-cluster: 1 to {MAX_NATS_CLUSTER} servers, got {args.nats_cluster}",
            file=sys.stderr,
        )
        return 2
    if args.nats_cluster > 1 and args.nats_url is not None:
        print(
            "motor up: --nats-cluster starts its own servers; it cannot be used with --nats-url",
            file=sys.stderr,
        )
        return 2

    highest = 65535 - NATS_MONITOR_OFFSET - args.nats_cluster
    if not 1 <= args.nats_port <= highest:
        print(f"motor up: --nats-port: 1 to {highest}, got {args.nats_port}", file=sys.stderr)
        return 2
    nats_ports = [
        args.nats_port + off + i
        for off in (0, NATS_ROUTE_OFFSET, NATS_MONITOR_OFFSET)
        for i in range(args.nats_cluster)
    ]
    needed = sum(sec.instances * sec.nodes_per_instance() for sec in cfg.sections().values())
    try:
        cfg, notes = one_machine_ports(
            cfg,
            args.nodes if args.nodes is not None else needed,
            not args.no_standby,
            nats_ports if args.nats_url is None else (),
        )
    except ValueError as exc:
        print(f"motor up: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"motor up: {note}", file=sys.stderr)
    ports = Ports(
        nats=args.nats_port,
        nats_monitor=args.nats_port + NATS_MONITOR_OFFSET,
        nats_route=args.nats_port + NATS_ROUTE_OFFSET,
        coordinator=cfg.coordinator.port,
        controller=cfg.controller.port,
        nodeagent=cfg.nodeagent.port_base,
        engine=cfg.nodeagent.engine_port_base,
    )
    try:
        cluster = LocalCluster(
            cfg,
            root=Path(args.root),
            ports=ports,
            nats_url=args.nats_url,
            nats_cluster=args.nats_cluster,
            nodes=args.nodes,
            standby=not args.no_standby,
            coordinators=args.coordinators,
            supervise=not args.no_restart,
            liveness=liveness,
            log_max_bytes=int(args.log_max_mb * 2**20) or None,
        )
    except ValueError as exc:
        print(f"motor up: {exc}", file=sys.stderr)
        return 2
    wanted: list[tuple[str, int]] = [("coordinator", ports.coordinator), ("controller", ports.controller)]
    if args.nats_url is None:
        for m in cluster.nats_members:
            label = "NATS" if cluster.nats_cluster == 1 else f"NATS {m.name}"
            wanted += [(label, m.port), (f"{label} monitoring", m.monitor_port)]
            if cluster.nats_cluster > 1:
                wanted.append((f"{label} routes", m.route_port))
    busy = [(what, p) for what, p in wanted if not _port_free("127.0.0.1", p)]
    if busy:
        names = ", ".join(f"{what} port {p}" for what, p in busy)
        print(
            f"motor up: {names} already in use — is another `motor up` running? "
            "Stop it (Ctrl-C in its terminal), or change the ports in a --config file.",
            file=sys.stderr,
        )
        return 1
    try:
        return asyncio.run(_run_up(cluster, live=not args.no_live and sys.stdout.isatty()))
    except KeyboardInterrupt:
        return 130


async def _run_up(cluster: Any, *, live: bool) -> int:
    from rich.console import Console

    from deploy.status import ready_summary, status_table
    from deploy.watch import StateWatcher, coordinator_serves
    from streams.connection import connect
    from streams.definitions import MOTOR_STREAM
    from streams.placement import StreamPlacement, stream_placement

    console = Console()

    def on_notice(n: Any) -> None:
        # Printed above the live table (rich keeps the table at the bottom).
        style = {"restarted": "green", "unresponsive": "red", "wedged": "red", "stuck": "red"}.get(
            n.kind, "yellow"
        )
        console.print(f"{time.strftime('%H:%M:%S')} [{style}]{n.describe()}[/]")
        if n.kind == "unresponsive" or (n.kind == "exited" and n.exit_code is not None and n.exit_code > 0):
            child = next((c for c in cluster.children if c.name == n.name), None)
            if child is not None:
                console.print(f"last lines of {child.log}:\n{_tail(child.log)}")

    cluster.supervisor.on_notice = on_notice
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP: the terminal closed under it; stopped in order, as on Ctrl-C.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    t0 = time.monotonic()
    plan = cluster.node_plan()
    with console.status("starting nats-server…"):
        try:
            await cluster.start()
        except Exception as exc:
            console.print(f"[red]motor up: could not start: {exc}[/]")
            await cluster.stop()
            console.print(f"logs: {cluster.logs}")
            return 1
    coords = "coordinator" if cluster.coordinators == 1 else f"{cluster.coordinators} coordinators"
    servers = "nats" if cluster.nats_cluster == 1 else f"a NATS cluster of {cluster.nats_cluster}"
    console.print(
        f"[green]started[/] {servers} ({cluster.url}), controller{'s c1+c2' if cluster.standby else ' c1'}, "
        f"{coords}, {len(plan)} node agents ({', '.join(p.node_id for p in plan)}) — logs in {cluster.logs}"
        + ("" if cluster.supervise else " (crashed processes stay down: --no-restart)")
    )
    nc = await connect(cluster.client_options("inspect"), name="motor-up")
    watcher = StateWatcher(nc)
    await watcher.start()
    js = nc.jetstream()
    placement: StreamPlacement | None = None
    asked = 0.0
    announced = False
    reported: set[str] = set()
    code = 0
    try:
        live_ctx: Any = contextlib.nullcontext()
        if live:
            from rich.live import Live

            live_ctx = Live(
                status_table(watcher.state, time.time(), placement), console=console, refresh_per_second=2
            )
        with live_ctx as lv:
            last_line = 0.0
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.5)
                state = watcher.state
                if time.monotonic() - asked > PLACEMENT_EVERY:
                    asked = time.monotonic()
                    placement = await stream_placement(js, MOTOR_STREAM)
                for child in cluster.exited():
                    if child.name not in reported:
                        reported.add(child.name)
                        tail = _tail(child.log)
                        console.print(
                            f"[red]{child.name} exited with code {child.proc.returncode}[/]; "
                            f"last lines of {child.log}:\n{tail}"
                        )
                active, total = ready_summary(state)
                if not announced and active > 0 and await coordinator_serves(cluster.coordinator_url):
                    announced = True
                    took = time.monotonic() - t0
                    console.print(_urls(cluster, state, took), soft_wrap=True)
                if lv is not None:
                    lv.update(status_table(state, time.time(), placement))
                elif time.monotonic() - last_line > 5:
                    last_line = time.monotonic()
                    restarts = sum(w.restarts for w in cluster.supervisor.watches.values())
                    console.print(
                        f"{time.strftime('%H:%M:%S')} instances active {active}/{total}, nodes {len(state.nodes)}"
                        + (f", {restarts} restarts" if restarts else "")
                        + (f", {placement.describe()}" if placement is not None else "")
                    )
    finally:
        await watcher.stop()
        await nc.close()
        with console.status("stopping…"):
            n = await cluster.stop()
        console.print(
            f"stopped {n} processes (controllers, coordinator, node agents, engines) and "
            + ("nats-server" if cluster.nats_cluster == 1 else f"{cluster.nats_cluster} nats-servers")
        )
    return code


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _urls(cluster: Any, state: Any, took: float) -> str:
    models = sorted({i.spec.model for i in state.instances.values()}) or ["motor-sim"]
    model = models[0]
    base = cluster.coordinator_url
    return (
        f"\n[bold green]ready[/] in {took:.1f}s — OpenAI endpoint {base}/v1 (model {model!r})\n"
        f"  curl {base}/v1/chat/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}]}}\'\n'
        f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='none'); "
        f"print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'hello'}}]).choices[0].message.content)\"\n"
        f"  controller {cluster.controller_url}/v1/instances · log: motor events ls --nats-url {cluster.url}"
        f"{_root_flag(cluster)}\n"
        "  Ctrl-C stops everything.\n"
    )


def _root_flag(cluster: Any) -> str:
    """` --root DIR` when the CLI would not find this cluster's NATS credentials by default."""
    if cluster.auth is None or cluster.root == Path(".motor").resolve():
        return ""
    return f" --root {cluster.root}"


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from deploy.status import status_table
    from deploy.watch import snapshot_state
    from streams.connection import connect
    from streams.definitions import MOTOR_STREAM
    from streams.placement import stream_placement

    async def go() -> int:
        nc = await asyncio.wait_for(connect(nats_options(args), name="motor-status"), timeout=5)
        try:
            state = await snapshot_state(nc)
            placement = await stream_placement(nc.jetstream(), MOTOR_STREAM)
        finally:
            await nc.close()
        Console().print(status_table(state, time.time(), placement))
        return 0

    from streams.errors import StreamsError

    try:
        return asyncio.run(go())
    except (OSError, TimeoutError, StreamsError) as exc:
        print(f"motor status: {unreachable_hint(args.nats_url, exc)} ({exc})", file=sys.stderr)
        return 1
