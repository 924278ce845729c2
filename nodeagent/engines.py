"""The engines of this node: start and stop them per endpoint, watch exits and health.

Every status change is handed to `on_change` at once (the agent turns it into an
`endpoint.status_changed` event). The run state file is rewritten whenever the set of
running engines changes, so a restarted agent can adopt them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.events import EndpointSpec, EndpointStatus, StartCommandData
from nodeagent import runstate
from nodeagent.backends import backend_for
from nodeagent.backends.launch import LaunchContext, LaunchSpec
from nodeagent.errors import CommandRefusal
from nodeagent.health import HealthTracker
from nodeagent.kvaddr import KvAddrs, kv_addrs
from nodeagent.loadmetrics import Load
from nodeagent.runstate import EndpointRun, RunState
from nodeagent.settings import AgentSettings, device_env, split_devices

if TYPE_CHECKING:
    from nodeagent.host import EngineHost, EngineProc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StatusChange:
    endpoint_id: int
    instance_id: int | None
    status: EndpointStatus
    previous: EndpointStatus | None
    reason: str
    exit_code: int | None = None
    pid: int | None = None  # the engine process: READY with another pid is a new incarnation


OnChange = Callable[[StatusChange], None]


@dataclass
class Endpoint:
    """One endpoint (DP rank) of this node and its engine process."""

    spec: EndpointSpec
    proc: EngineProc
    tracker: HealthTracker
    serves_http: bool
    log_file: Path
    status: EndpointStatus | None = None  # None until the first report
    reason: str = ""
    exit_code: int | None = None
    load: Load | None = None
    stopping: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return not self.proc.exited

    def url(self, path: str) -> str:
        return f"http://{self.spec.ip}:{self.spec.business_port}{path}"


# `motor up` finds the engines of a session by this variable (deploy.sweep): the one of Motor's
# an engine keeps.
KEPT_FOR_ENGINES = frozenset({"MOTOR_UP_SESSION"})


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What an engine inherits from its agent: everything but Motor's own variables, which name
    the agent's NATS login (`MOTOR_NATS_CONTEXT`, `MOTOR_NATS_PASSWORD` …) and API keys an
    engine has no business with (its section's `env` is laid on top)."""
    return {k: v for k, v in environ.items() if not k.startswith("MOTOR_") or k in KEPT_FOR_ENGINES}


class Engines:
    def __init__(self, settings: AgentSettings, host: EngineHost, on_change: OnChange) -> None:
        self.settings = settings
        self.host = host  # this machine's processes (nodeagent.host), or the simulator's
        self.on_change = on_change
        self.endpoints: dict[int, Endpoint] = {}
        self.instance_id: int | None = None
        self.start_cmd: StartCommandData | None = None
        self.start_seq = 0  # stream sequence of the start command the engines answer
        self.done: tuple[tuple[str, runstate.Outcome], ...] = ()
        self.term = 0  # newest leader term seen on a command (nodeagent.commands.check_term)
        self._lock = asyncio.Lock()  # one start/stop at a time

    # ------------------------------------------------------------------ queries

    def running_ids(self) -> tuple[int, ...]:
        return tuple(sorted(i for i, ep in self.endpoints.items() if ep.live))

    def all_ready(self) -> bool:
        eps = list(self.endpoints.values())
        return bool(eps) and all(ep.status == EndpointStatus.READY for ep in eps)

    def run_state(self) -> RunState:
        return RunState(
            node_id=self.settings.node_id,
            instance_id=self.instance_id,
            job_name=self.start_cmd.job_name if self.start_cmd else None,
            start=self.start_cmd,
            start_seq=self.start_seq,
            endpoints=tuple(
                EndpointRun(
                    endpoint_id=ep.spec.id,
                    pid=ep.proc.pid,
                    start_time=ep.proc.start_time,
                    business_port=ep.spec.business_port,
                    serves_http=ep.serves_http,
                    log_file=str(ep.log_file),
                    spec=ep.spec,
                )
                for ep in self.endpoints.values()
                if ep.live
            ),
            done=self.done,
            term=self.term,
        )

    def save(self) -> None:
        runstate.save(self.settings.state_file, self.run_state())

    def remember(self, command_id: str, outcome: runstate.Outcome) -> None:
        self.done = runstate.remember(self.run_state(), command_id, outcome).done
        self.save()

    # ------------------------------------------------------------------ transitions

    def _set(self, ep: Endpoint, status: EndpointStatus, reason: str, exit_code: int | None = None) -> None:
        previous = ep.status
        if previous == status:
            return
        ep.status, ep.reason, ep.exit_code = status, reason, exit_code
        log.info("endpoint %d: %s -> %s (%s)", ep.spec.id, previous and previous.value, status.value, reason)
        self.on_change(
            StatusChange(ep.spec.id, self.instance_id, status, previous, reason, exit_code, ep.proc.pid)
        )

    def reassert(self, reason: str) -> list[int]:
        """Report each reported endpoint's current status again; the ids reported.

        For when the log no longer shows it after something that reset it: a re-registration
        (the fold resets running endpoints to STARTING) or a start that found them running.
        """
        out = []
        for ep in self.endpoints.values():
            if ep.live and ep.status is not None and not ep.stopping:
                self.on_change(
                    StatusChange(
                        ep.spec.id, self.instance_id, ep.status, ep.status, reason, ep.exit_code, ep.proc.pid
                    )
                )
                out.append(ep.spec.id)
        return out

    def report(self, endpoint_ids: tuple[int, ...], instance_id: int, reason: str) -> None:
        """Say again what each of these endpoints of `instance_id` is: its status while it runs
        or lies dead, STOPPED once it no longer runs here. For a start answered from memory:
        the log may have lost what followed it, and its sender judges from the log."""
        for i in endpoint_ids:
            ep = self.endpoints.get(i)
            if ep is not None:
                if ep.status is not None and not ep.stopping and self.instance_id == instance_id:
                    self.on_change(
                        StatusChange(
                            i, self.instance_id, ep.status, ep.status, reason, ep.exit_code, ep.proc.pid
                        )
                    )
            elif self.instance_id in (None, instance_id):
                self.on_change(StatusChange(i, instance_id, EndpointStatus.STOPPED, None, reason))

    # ------------------------------------------------------------------ start

    def kv_addrs(self, ep: EndpointSpec) -> KvAddrs | None:
        """Where the endpoint's engine publishes KV events (None: its section publishes none)."""
        s = self.settings
        return kv_addrs(s.section, s.state_dir, s.node_id, ep)

    def launch_spec(self, cmd: StartCommandData, ep: EndpointSpec) -> LaunchSpec:
        section = self.settings.section
        ctx = LaunchContext(
            section=section,
            role=cmd.role,
            instance_id=cmd.instance_id,
            endpoint=ep,
            master_dp_ip=cmd.master_dp_ip,
            node_rank=cmd.node_rank,
            nnodes=cmd.nnodes,
            python=self.settings.python,
            kv_events=kv.config if (kv := self.kv_addrs(ep)) is not None else None,
        )
        return backend_for(section.engine_type).launch(ctx)

    def engine_env(self, spec: LaunchSpec, ep: EndpointSpec, n_endpoints: int) -> dict[str, str]:
        devices = split_devices(self.settings.devices, n_endpoints, ep.id)
        return {
            **inherited_env(os.environ),
            **self.settings.section.env,
            **spec.env,
            **device_env(self.settings.device_env, devices),
        }

    async def start(self, cmd: StartCommandData, seq: int = 0) -> bool:
        """Start the command's endpoints that are not running; False when all already were."""
        async with self._lock:
            live = self.running_ids()
            if live and self.instance_id is not None and self.instance_id != cmd.instance_id:
                raise CommandRefusal(
                    "busy", f"node runs instance {self.instance_id} (endpoints {list(live)}); stop it first"
                )
            todo = [e for e in cmd.endpoints if e.id not in live]
            if not todo:
                return False
            for e in todo:
                for port, what in ((e.business_port, "business"), (e.bootstrap_port, "bootstrap")):
                    if port is not None and not self.host.port_free(e.ip, port):
                        raise CommandRefusal(
                            "port_in_use", f"endpoint {e.id}: {what} port {e.ip}:{port} is already in use"
                        )
            specs = [(e, self.launch_spec(cmd, e)) for e in todo]
            self.instance_id, self.start_cmd, self.start_seq = cmd.instance_id, cmd, seq
            started: list[Endpoint] = []
            try:
                for e, spec in specs:
                    log_file = self.settings.log_file(e.id)
                    for d in spec.dirs:  # e.g. vLLM's per-engine socket and cache dirs
                        try:
                            os.makedirs(d, exist_ok=True)
                        except OSError as exc:
                            raise CommandRefusal(
                                "spawn_failed", f"cannot create {d}: {exc.strerror}"
                            ) from None
                    proc = await self.host.spawn(
                        spec.argv, self.engine_env(spec, e, len(cmd.endpoints)), log_file
                    )
                    started.append(self._track(e, proc, spec.serves_http, log_file))
            except CommandRefusal:
                for ep in started:
                    ep.stopping = True
                    await ep.proc.stop(self.settings.stop_grace)
                    await self._forget(ep)
                if not self.running_ids():
                    self.instance_id, self.start_cmd = None, None
                self.save()
                raise
            self.save()
            return True

    def _track(self, spec: EndpointSpec, proc: EngineProc, serves_http: bool, log_file: Path) -> Endpoint:
        loop = asyncio.get_running_loop()
        tracker = HealthTracker(self.settings.section.health_check_config, loop.time())
        ep = Endpoint(spec=spec, proc=proc, tracker=tracker, serves_http=serves_http, log_file=log_file)
        old = self.endpoints.get(spec.id)
        if old is not None:
            ep.status = old.status  # a restart after DEAD is reported as DEAD -> STARTING
        self.endpoints[spec.id] = ep
        if proc.adopted:
            # The re-registration says STARTING for it; health is watched once that is out.
            ep.status = EndpointStatus.STARTING
            ep.reason = f"engine pid {proc.pid} adopted after an agent restart"
        else:
            self._set(ep, EndpointStatus.STARTING, f"engine pid {proc.pid} started")
            self._watch(ep)
        ep.tasks.append(asyncio.create_task(self._watch_exit(ep), name=f"exit-{spec.id}"))
        return ep

    def _watch(self, ep: Endpoint) -> None:
        if ep.serves_http:
            ep.tasks.append(asyncio.create_task(self._watch_health(ep), name=f"health-{ep.spec.id}"))
        else:
            # A headless follower has no API server: its lifecycle is its process.
            self._set(ep, EndpointStatus.READY, "headless follower running")

    def watch_adopted(self) -> None:
        """Start watching adopted engines' health (once the re-registration is out)."""
        for ep in self.endpoints.values():
            if ep.proc.adopted and ep.live and not any(t.get_name().startswith("health-") for t in ep.tasks):
                self._watch(ep)

    async def _watch_exit(self, ep: Endpoint) -> None:
        ex = await ep.proc.wait()
        if ep.stopping:
            return
        for t in ep.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self._set(ep, EndpointStatus.DEAD, ex.reason, ex.code)
        with contextlib.suppress(OSError):
            self.save()
        # What the main process started (vLLM's engine core and worker) outlives its death by a
        # signal, holding gigabytes and ports: reap the rest of its process group now.
        await ep.proc.stop(self.settings.stop_grace)

    async def _watch_health(self, ep: Endpoint) -> None:
        cfg = self.settings.section.health_check_config
        loop = asyncio.get_running_loop()
        url = ep.url("/health")
        while ep.live and not ep.stopping:
            ok, detail = await self.host.health(url, cfg)
            if not ep.live or ep.stopping:
                return
            t = ep.tracker.observe(ok, detail, loop.time())
            if t is not None:
                self._set(ep, t.status, t.reason)
            await asyncio.sleep(cfg.interval)

    # ------------------------------------------------------------------ stop

    async def stop(self, endpoint_ids: tuple[int, ...] = (), reason: str = "") -> list[int]:
        """Stop the given endpoints (all when empty); return the ids that were running."""
        async with self._lock:
            ids = list(endpoint_ids) or list(self.endpoints)
            eps = [self.endpoints[i] for i in ids if i in self.endpoints]
            running = [ep.spec.id for ep in eps if ep.live]
            for ep in eps:
                ep.stopping = True
                for t in ep.tasks:
                    t.cancel()
            exits = await asyncio.gather(*(ep.proc.stop(self.settings.stop_grace) for ep in eps if ep.live))
            codes = iter(exits)
            for ep in eps:
                code = next(codes).code if ep.spec.id in running else ep.exit_code
                self._set(ep, EndpointStatus.STOPPED, reason or "stopped by command", code)
                await self._forget(ep)
            if not self.endpoints:
                self.instance_id, self.start_cmd, self.start_seq = None, None, 0
            self.save()
            return running

    async def _forget(self, ep: Endpoint) -> None:
        for t in ep.tasks:
            t.cancel()
        for t in ep.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await ep.proc.close()
        if self.endpoints.get(ep.spec.id) is ep:
            del self.endpoints[ep.spec.id]

    # ------------------------------------------------------------------ restart

    def adopt(self, state: RunState) -> list[int]:
        """Take over the engines an earlier agent left running; return their endpoint ids."""
        self.done, self.term = state.done, state.term
        adopted: list[int] = []
        for run in state.endpoints:
            proc = self.host.adopt(run.pid, run.start_time)
            if proc is None:
                log.info("endpoint %d: engine pid %d from the run state is gone", run.endpoint_id, run.pid)
                continue
            spec = run.spec or EndpointSpec(
                id=run.endpoint_id,
                ip=self.settings.ip,
                business_port=run.business_port,
                mgmt_port=run.business_port,
            )
            self._track(
                spec, proc, run.serves_http, Path(run.log_file or self.settings.log_file(run.endpoint_id))
            )
            adopted.append(run.endpoint_id)
        if adopted:
            self.instance_id, self.start_cmd, self.start_seq = state.instance_id, state.start, state.start_seq
        self.save()
        return adopted

    async def close(self, stop_engines: bool) -> None:
        """Stop the engines (or leave them running for the next agent) and the watchers."""
        if stop_engines and self.endpoints:
            await self.stop(reason="node agent shutting down")
            return
        for ep in list(self.endpoints.values()):
            ep.stopping = True
            for t in ep.tasks:
                t.cancel()
            for t in ep.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await ep.proc.close()
