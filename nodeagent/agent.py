"""The node agent: registration, commands, engines, heartbeats, faults and snapshots, composed.

Start-up order matters: adopt the engines an earlier agent left running, serve HTTP, bind the
command consumer, then register (so no command can arrive before it can be consumed and the
registration already tells the truth about running engines). Shutdown stops the engines
unless `keep_engines` is set; a crash leaves them running for the next agent to adopt.

Only a stop signal ends the agent: each part runs under `keep_running`, so a NATS error or
timeout that escapes a part restarts that part and never stops an engine; the start-up steps
that ask NATS (the streams, the command consumer) are tried until NATS answers
(`streams.retry.until_done`), so a cold start of a whole fleet that keeps NATS busy past a
request's timeout is waited out, not an exit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import aiohttp

from core.events import (
    DrainRequested,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    NodeDeregistered,
    NodeDeregisteredData,
    NodeRegistered,
    NodeRegisteredData,
    SnapshotCheckpoint,
    SnapshotCheckpointData,
    SnapshotPhase,
)
from core.ids import new_id
from nodeagent import runstate
from nodeagent.agentstatus import agent_status
from nodeagent.command_handler import CommandHandler
from nodeagent.commands import CommandConsumer
from nodeagent.drain import sigterm_drain, wait_idle
from nodeagent.engines import Engines, StatusChange
from nodeagent.faults import FaultReporter
from nodeagent.heartbeat import Heartbeats
from nodeagent.host import EngineHost, ProcessHost
from nodeagent.http import HttpView, create_app, serve
from nodeagent.kvwatch import start_kvwatch
from nodeagent.metrics import AgentMetrics
from nodeagent.outbox import Outbox
from nodeagent.parts import Part, keep_running
from nodeagent.registration import build_registration
from nodeagent.resync import Observer, Running
from nodeagent.settings import AgentSettings
from nodeagent.snapshot import Snapshot
from nodeagent.suicide import suicide_watch
from streams.connection import NatsOptions, connect
from streams.jetstream import JetStreamLog
from streams.log import Log
from streams.retry import Abandoned, until_done

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        log: Log | None = None,
        host: EngineHost | None = None,
        http: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`log`: the log to run on (default: connect to NATS from the settings); `host`: where
        engines run (default: this machine's processes); `http`: serve the agent's HTTP API.
        The simulator (tests/sim) gives its own log, engines and clocks, and no HTTP."""
        self.settings = settings
        self.source = f"nodeagent/{settings.node_id}"
        self.job_name = settings.job_name
        self.metrics = AgentMetrics(settings.node_id)
        self.port = settings.port
        self.registered = False
        self._last_reg: NodeRegisteredData | None = None
        self.clock = clock
        self.monotonic = monotonic
        self._given_log = log
        self._given_host = host
        self._http = http
        self._log: Log | None = None
        self._outbox: Outbox | None = None
        self._engines: Engines | None = None
        self._observer: Observer | None = None
        self._snapshot: Snapshot | None = None

    # ------------------------------------------------------------------ accessors

    @property
    def engines(self) -> Engines:
        assert self._engines is not None
        return self._engines

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None
        return self._outbox

    @property
    def agent_url(self) -> str:
        return f"http://{self.settings.ip}:{self.port}"

    def _event(self, cls: type[EventBase], data: Any, event_id: str | None = None) -> Any:
        return cls(id=event_id or new_id(), ts=self.clock(), source=self.source, data=data)  # type: ignore[call-arg]

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set; return the exit code."""
        try:
            return await self._serve(stop)
        except Abandoned as exc:
            # Engines adopted so far keep running, as after a crash: the next agent adopts them.
            log.info("node agent %s stopped during start-up: %s", self.settings.node_id, exc)
            return 0

    async def _serve(self, stop: asyncio.Event) -> int:
        s = self.settings
        build_registration(s)  # a config that cannot run fails here, before anything starts
        async with AsyncExitStack() as stack:
            motor = self._given_log
            if motor is None:
                nc = await connect(
                    NatsOptions.from_config(s.config.nats, s.nats_urls),
                    name=f"nodeagent-{s.node_id}",
                    retry_initial=True,
                )
                motor = JetStreamLog(nc)
                stack.push_async_callback(motor.close)
            self._log = motor
            # Create what is missing, change nothing: stream settings are the controller's and
            # motor up's (a node agent's NATS user may not change them).
            await until_done(
                "create the streams",
                lambda: motor.ensure_streams(
                    s.config.nats, lease_ttl=s.config.controller.lease_ttl, update=False
                ),
                log,
                stop=stop,
            )
            self._outbox = Outbox(motor.publisher(), self.metrics)
            self._outbox.start()
            stack.push_async_callback(self._outbox.close)
            host = self._given_host
            if host is None:
                session = aiohttp.ClientSession()
                stack.push_async_callback(session.close)
                host = ProcessHost(session)
            self._engines = Engines(s, host, self._on_change)
            if (kvwatch := start_kvwatch(s, self.engines, motor, self.metrics)) is not None:
                stack.push_async_callback(kvwatch.close)  # after the engines stop (LIFO)
            adopted = self.engines.adopt(runstate.load(s.state_file, s.node_id))
            if adopted:
                log.info("adopted running engines %s of instance %s", adopted, self.engines.instance_id)
            restored_job = None
            section = s.section
            if section.snapshot.enabled:
                self._snapshot = Snapshot(section.snapshot, s.ip, self._on_snapshot, self.engines.all_ready)
                restored_job = self._snapshot.restored_job()
                if restored_job:
                    log.info("restored from a container snapshot: job %s", restored_job)
                    self.job_name = restored_job

            if self._http:
                runner, self.port = await serve(create_app(self._http_view()), s.bind_host, s.port)
                stack.push_async_callback(runner.cleanup)

            cmds = s.config.nodeagent
            handler = CommandHandler(
                s,
                self.job_name,
                self.engines,
                self.outbox.send,
                self.metrics,
                self._snapshot,
                clock=self.clock,
                monotonic=self.monotonic,
            )
            consumer = CommandConsumer(
                motor,
                s.node_id,
                handler.handle,
                handler.refuse,
                self.metrics,
                ack_wait=max(60.0, 3 * s.stop_grace),
                attempts=cmds.command_attempts,
                retry_delay=cmds.command_retry_delay,
                clock=self.clock,
                monotonic=self.monotonic,
            )
            await until_done("bind the command consumer", consumer.subscribe, log, stop=stop)
            stack.push_async_callback(consumer.close)
            self._observer = Observer(
                motor,
                s.node_id,
                self._running,
                self._reregister,
                interval=s.resync_interval,
                restate=self._restate,
                clock=self.clock,
                monotonic=self.monotonic,
            )
            await self._observer.start()
            stack.push_async_callback(self._observer.close)

            await self.register("restored" if restored_job else "start", restored=bool(restored_job))
            self.engines.watch_adopted()
            if restored_job and self._snapshot is not None:
                self._snapshot.mark_restored()

            heartbeats = Heartbeats(
                s,
                motor,
                host,
                self.engines,
                self.metrics,
                self._snapshot_pending,
                clock=self.clock,
                monotonic=self.monotonic,
            )
            if s.config.nodeagent.suicide_threshold:
                heartbeats.on_beat = suicide_watch(
                    s, self.engines, self.outbox.post, self.metrics, clock=self.clock
                ).on_beat
            parts: dict[str, Part] = {
                "commands": consumer.run,
                "heartbeats": heartbeats.run,
                "resync": self._observer.run,
            }
            if s.fault_reporter_on:
                parts["faults"] = FaultReporter(
                    s, self.engines, host.fault_status, self.outbox.post, self.metrics, clock=self.clock
                ).run
            if self._snapshot is not None:
                parts["snapshot"] = self._snapshot.run
            tasks = {
                asyncio.create_task(keep_running(name, part, self._part_restarted), name=name)
                for name, part in parts.items()
            }
            log.info("node agent %s up: %s, HTTP on %s", s.node_id, s.role.value, self.agent_url)
            await stop.wait()
            log.info("node agent %s shutting down", s.node_id)
            await self._drain_before_stop()
            consumer.stop()
            await self._stop_parts(tasks)
            await self._shutdown()
        log.info("node agent %s stopped", s.node_id)
        return 0

    @staticmethod
    async def _stop_parts(tasks: set[asyncio.Task[None]]) -> None:
        for t in tasks:
            t.cancel()
        # Bounded: a library that swallows a cancellation must not hang the shutdown.
        _, stuck = await asyncio.wait(tasks, timeout=5.0)
        for t in stuck:
            log.warning("%s did not stop within 5s; leaving it", t.get_name())

    def _part_restarted(self, name: str) -> None:
        self.metrics.part_restarts.labels(self.settings.node_id, name).inc()

    async def _drain_before_stop(self) -> None:
        """On SIGTERM, engines that serve finish what they carry first (`nodeagent.drain_timeout`)."""
        data = sigterm_drain(self.settings, self.engines, self.source)
        if data is not None:
            self.outbox.post(self._event(DrainRequested, data, data.drain_id))
            log.info("draining instance %s before stopping (at most %.0fs)", data.instance_id, data.timeout)
            settle = self.settings.config.nodeagent.drain_settle
            drained = await wait_idle(self.engines, (), data.timeout, settle, self.monotonic)
            log.info("instance %s: %s", data.instance_id, drained.detail())

    async def _shutdown(self) -> None:
        keep = self.settings.keep_engines
        had = bool(self.engines.endpoints)
        await self.engines.close(stop_engines=not keep)
        if not keep:
            reason = "node agent shut down" + (" and stopped its engines" if had else "")
            gone = NodeDeregisteredData(node_id=self.settings.node_id, reason=reason)
            self.outbox.post(self._event(NodeDeregistered, gone))
        await self.outbox.drain(5.0)

    # ------------------------------------------------------------------ registration

    async def register(self, why: str, *, restored: bool = False, restated: bool = False) -> int:
        """Publish `node.registered` with the engines that run here now; return its sequence.
        `restated`: the last one said again against age-out (its `restored` kept: nothing new)."""
        running = self.engines.running_ids()
        if restated and self._last_reg is not None:
            restored = self._last_reg.restored
        data = build_registration(
            self.settings,
            agent_url=self.agent_url,
            instance_id=self.engines.instance_id if running else None,
            running_endpoints=running,
            restored=restored,
            job_name=self.job_name,
        )
        if restated:
            data = data.model_copy(update={"restated": True})
        seq = await self.outbox.send(self._event(NodeRegistered, data))
        self._last_reg = data
        self.registered = True
        self.metrics.registrations.labels(self.settings.node_id, why).inc()
        if self._observer is not None:
            self._observer.registered_at(seq)
        log.info(
            "registered (%s) at seq %d: instance %s, running %s", why, seq, data.instance_id, list(running)
        )
        return seq

    async def _restate(self, reason: str) -> None:
        await self.register("restate", restated=True)
        # A fold that starts after the first READY aged out learns it from these.
        self.engines.reassert("re-asserted against MOTOR's age-out")

    async def _reregister(self, reason: str) -> None:
        await self.register("resync")
        # The registration reset the fold's view of running endpoints to STARTING.
        self.engines.reassert("re-asserted after registering again")

    def _running(self) -> Running:
        e = self.engines
        return Running(e.instance_id, e.running_ids(), e.start_seq)

    # ------------------------------------------------------------------ events from parts

    def _on_change(self, c: StatusChange) -> None:
        self.metrics.set_status(c.endpoint_id, c.status)
        if c.status == EndpointStatus.DEAD:
            self.metrics.engine_exits.labels(self.settings.node_id).inc()
        data = EndpointStatusChangedData(
            node_id=self.settings.node_id,
            endpoint_id=c.endpoint_id,
            instance_id=c.instance_id,
            status=c.status,
            previous=c.previous,
            reason=c.reason,
            exit_code=c.exit_code,
            pid=c.pid,
        )
        if self._outbox is not None:
            self.outbox.post(self._event(EndpointStatusChanged, data))

    def _on_snapshot(self, phase: SnapshotPhase, metadata: dict[str, str]) -> None:
        data = SnapshotCheckpointData(
            node_id=self.settings.node_id,
            phase=phase,
            instance_id=self.engines.instance_id,
            job_name=self.job_name,
            pod_ip=self.settings.ip,
            metadata=metadata,
        )
        self.outbox.post(self._event(SnapshotCheckpoint, data))

    def _snapshot_pending(self) -> bool:
        return self._snapshot is not None and self._snapshot.pending

    # ------------------------------------------------------------------ HTTP

    def _http_view(self) -> HttpView:
        return HttpView(status=self.status, ready=self.ready, alive=self.alive, metrics=self.metrics)

    def ready(self) -> bool:
        """Serving (every endpoint READY), or at the snapshot steady point."""
        if self._snapshot is not None and self._snapshot.steady:
            return True
        return self._engines is not None and self.engines.all_ready()

    def alive(self) -> bool:
        """Running on a log whose connection is not closed for good."""
        motor = self._log
        if motor is None:
            return False
        return not motor.nc.is_closed if isinstance(motor, JetStreamLog) else True

    def status(self) -> dict[str, Any]:
        """What `/node-manager/status` shows."""
        return agent_status(
            self.settings, self.job_name, self.registered, self.ready(), self._engines, self._snapshot
        )
