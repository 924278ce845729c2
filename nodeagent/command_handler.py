"""Carrying out a start/stop command: the checks, the engines, and the one answer it gets.

A command is answered `command.applied` or `command.refused` (a `Refusal`: code and reason)
and the outcome is remembered in the run state, so a redelivered command (or one seen again
after a restart) is answered the same way and never runs twice. A command of an older leader
term than one already seen is refused (`stale_term`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from core.bounds import MAX_SEEN_TERM
from core.eventdata import STALE_TERM
from core.events import (
    CommandApplied,
    CommandAppliedData,
    CommandRefused,
    CommandRefusedData,
    EndpointSpec,
    EngineOpCommand,
    EngineOpCompleted,
    EventBase,
    Role,
    StartCommand,
    StartCommandData,
    StopCommand,
)
from core.ids import derive_id
from nodeagent import runstate
from nodeagent.commands import Command
from nodeagent.drain import wait_idle
from nodeagent.engine_op_handler import engine_op_answer, run_engine_op
from nodeagent.engines import Engines
from nodeagent.errors import CommandRefusal, Refusal
from nodeagent.metrics import AgentMetrics
from nodeagent.registration import build_registration
from nodeagent.runstate import Outcome
from nodeagent.settings import AgentSettings
from nodeagent.snapshot import Snapshot

log = logging.getLogger(__name__)

Verb = Literal["start", "stop"]
Send = Callable[[EventBase], Awaitable[int]]  # publish an event, return its stream sequence


def verb_of(cmd: StartCommand | StopCommand) -> Verb:
    return "start" if isinstance(cmd, StartCommand) else "stop"


def answer(
    node_id: str, source: str, cmd: Command, outcome: Outcome, *, ts: float | None = None, detail: str = ""
) -> CommandApplied | CommandRefused | EngineOpCompleted:
    """The event answering `cmd` (at `ts`, default now); its id derives from the command's, so
    a repeated answer is one. An engine op is answered with its results (none here: an answer
    sent again, or a refusal)."""
    when = time.time() if ts is None else ts
    if isinstance(cmd, EngineOpCommand):
        refusal = outcome if isinstance(outcome, Refusal) else None
        return engine_op_answer(node_id, source, cmd, refused=refusal, ts=when)
    d = cmd.data
    eid = derive_id("command-result", node_id, d.command_id)
    verb = verb_of(cmd)
    if isinstance(outcome, Refusal):
        refused = CommandRefusedData(
            command_id=d.command_id,
            node_id=node_id,
            verb=verb,
            instance_id=d.instance_id,
            code=outcome.code,
            reason=outcome.reason,
            seen_term=outcome.seen_term,
        )
        return CommandRefused(id=eid, ts=when, source=source, data=refused)
    applied = CommandAppliedData(
        command_id=d.command_id, node_id=node_id, verb=verb, instance_id=d.instance_id, detail=detail
    )
    return CommandApplied(id=eid, ts=when, source=source, data=applied)


def check_term(term: int, newest: int) -> None:
    """Raise CommandRefusal for a command of an older leader term than one already seen.

    A deposed leader's command that lands after its successor's must not undo what the
    successor ordered. Term 0 is a command from before terms were stamped: older than any.
    """
    if term < newest:
        raise CommandRefusal(
            STALE_TERM,
            f"command of leader term {term}, this node has seen term {newest} already",
            # No refusal may name more (`core.bounds`); the leader announces past what it
            # names, and past the refused command's own term, so it still catches up.
            seen_term=min(newest, MAX_SEEN_TERM),
        )


def check_start(
    cmd: StartCommandData,
    *,
    node_id: str,
    job_name: str,
    role: Role,
    engine_type: str,
    registered: tuple[EndpointSpec, ...],
) -> None:
    """Raise CommandRefusal when a start command does not fit this node."""
    if cmd.node_id != node_id:
        raise CommandRefusal("wrong_node", f"command is for node {cmd.node_id!r}, this is {node_id!r}")
    if cmd.job_name != job_name:
        raise CommandRefusal(
            "job_mismatch", f"command job_name {cmd.job_name!r} does not match this node's job {job_name!r}"
        )
    if cmd.role != role:
        raise CommandRefusal("role_mismatch", f"command role {cmd.role.value!r}, this node is {role.value!r}")
    if cmd.engine_type != engine_type:
        raise CommandRefusal(
            "engine_mismatch", f"command engine_type {cmd.engine_type!r}, this node runs {engine_type!r}"
        )
    if not cmd.endpoints:
        raise CommandRefusal("bad_endpoint", "command lists no endpoints")
    mine = {e.id: e for e in registered}
    seen: set[int] = set()
    for e in cmd.endpoints:
        if e.id in seen:
            raise CommandRefusal("bad_endpoint", f"endpoint {e.id} listed twice")
        seen.add(e.id)
        reg = mine.get(e.id)
        if reg is None:
            raise CommandRefusal(
                "bad_endpoint", f"endpoint {e.id} is not registered here (have {sorted(mine)})"
            )
        if (e.ip, e.business_port) != (reg.ip, reg.business_port):
            raise CommandRefusal(
                "bad_endpoint",
                f"endpoint {e.id} at {e.ip}:{e.business_port}, registered at {reg.ip}:{reg.business_port}",
            )


class CommandHandler:
    """Carries out this node's commands on its engines and answers each one (`handle`, `refuse`)."""

    def __init__(
        self,
        settings: AgentSettings,
        job_name: str,
        engines: Engines,
        send: Send,
        metrics: AgentMetrics,
        snapshot: Snapshot | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.monotonic = monotonic
        self.node_id = settings.node_id
        self.source = f"nodeagent/{settings.node_id}"
        self.job_name = job_name
        self.engines = engines
        self.send = send
        self.metrics = metrics
        self.snapshot = snapshot

    async def handle(self, cmd: Command, seq: int) -> None:
        """Carry out the command at stream sequence `seq` (once) and answer it."""
        d = cmd.data
        prior = runstate.outcome_of(self.engines.run_state(), d.command_id)
        if prior is not None:
            log.info("command %s already %s; answering again, doing nothing", d.command_id, prior)
            await self.send(answer(self.node_id, self.source, cmd, prior, ts=self.clock()))
            if prior == "applied" and isinstance(cmd, StartCommand):
                # Sent again, perhaps because the log lost what followed it (a lost tail took the
                # answer and the READY, or the start and the death of the engine it made): whoever
                # sent it judges from the log, so the log must hold what its endpoints are now
                # (found by the simulator, tests/sim, seeds 353 and 389).
                ids = tuple(e.id for e in cmd.data.endpoints)
                self.engines.report(ids, cmd.data.instance_id, f"as of start {d.command_id}, answered again")
            return
        outcome: Outcome = "applied"
        detail = ""
        if isinstance(cmd, EngineOpCommand):
            await self._engine_op(cmd, seq)
            return
        try:
            self._newer_term(d.term)
            if isinstance(cmd, StartCommand):
                await self._start(cmd, seq)
            else:
                detail = await self._stop(cmd)
        except CommandRefusal as r:
            log.warning("command %s (%s) at seq %d refused: %s", d.command_id, cmd.type, seq, r)
            outcome = r.refusal
        await self.send(answer(self.node_id, self.source, cmd, outcome, ts=self.clock(), detail=detail))
        self.engines.remember(d.command_id, outcome)
        result = "refused" if isinstance(outcome, Refusal) else "applied"
        self.metrics.commands.labels(self.node_id, verb_of(cmd), result).inc()

    async def _engine_op(self, cmd: EngineOpCommand, seq: int) -> None:
        """Run a fleet operation's op on the engines and answer with a result per engine."""
        d = cmd.data
        outcome: Outcome = "applied"
        try:
            self._newer_term(d.term)
            if d.node_id != self.node_id:
                raise CommandRefusal(
                    "wrong_node", f"command is for node {d.node_id!r}, this is {self.node_id!r}"
                )
        except CommandRefusal as r:
            log.warning("engine op %s at seq %d refused: %s", d.command_id, seq, r)
            outcome = r.refusal
        if isinstance(outcome, Refusal):
            ev = engine_op_answer(self.node_id, self.source, cmd, refused=outcome, ts=self.clock())
        else:
            timeout = self.settings.config.nodeagent.engine_op_timeout
            results = await run_engine_op(
                self.engines, self.settings.section.engine_type, cmd, within=timeout
            )
            ev = engine_op_answer(self.node_id, self.source, cmd, results, ts=self.clock())
        await self.send(ev)
        self.engines.remember(d.command_id, outcome)
        self.metrics.commands.labels(
            self.node_id, "engine_op", "refused" if isinstance(outcome, Refusal) else "applied"
        ).inc()

    async def refuse(self, cmd: Command, refusal: Refusal) -> None:
        """Answer a command that could not be handled with `command.refused` (and remember it)."""
        await self.send(answer(self.node_id, self.source, cmd, refusal, ts=self.clock()))
        verb = "engine_op" if isinstance(cmd, EngineOpCommand) else verb_of(cmd)
        self.metrics.commands.labels(self.node_id, verb, "refused").inc()
        try:
            self.engines.remember(cmd.data.command_id, refusal)
        except OSError as exc:  # the run state may be why handling failed
            log.warning("command %s: outcome not saved: %s", cmd.data.command_id, exc)

    def _newer_term(self, term: int) -> None:
        """Refuse a command of an older leader term; remember a newer one (saved with the outcome)."""
        newest = self.engines.term
        if term < newest:
            self.metrics.commands_rejected.labels(self.node_id, STALE_TERM).inc()
        check_term(term, newest)
        if term > newest:
            log.info("leader term %d (was %d)", term, newest)
            self.engines.term = term

    async def _start(self, cmd: StartCommand, seq: int) -> None:
        d, s = cmd.data, self.settings
        registered = build_registration(s, job_name=self.job_name).endpoints
        check_start(
            d,
            node_id=s.node_id,
            job_name=self.job_name,
            role=s.role,
            engine_type=s.section.engine_type,
            registered=registered,
        )
        started = await self.engines.start(d, seq)
        if not started:
            log.info("start %s: instance %d already running here; nothing to do", d.command_id, d.instance_id)
            # Whoever sent it waits for READY after its start (e.g. an instance re-adopted
            # after a lost log tail): say again what the endpoints are.
            self.engines.reassert(f"already running for start {d.command_id}")
        if self.snapshot is not None:
            self.snapshot.prepare(d)

    async def _stop(self, cmd: StopCommand) -> str:
        """Stop the engines the command names; a drain waits for them to go idle first."""
        d = cmd.data
        if d.node_id != self.node_id:
            raise CommandRefusal("wrong_node", f"command is for node {d.node_id!r}, this is {self.node_id!r}")
        mine = self.engines.instance_id
        if d.instance_id is not None and mine is not None and d.instance_id != mine:
            log.info(
                "stop %s for instance %d, this node runs %d: nothing to do", d.command_id, d.instance_id, mine
            )
            return ""
        detail = ""
        if d.drain_timeout > 0 and self.engines.endpoints:
            log.info(
                "drain %s: waiting up to %.0fs for the engines to go idle", d.command_id, d.drain_timeout
            )
            settle = self.settings.config.nodeagent.drain_settle
            drained = await wait_idle(self.engines, d.endpoint_ids, d.drain_timeout, settle, self.monotonic)
            detail = drained.detail()
            log.info("drain %s: %s", d.command_id, detail)
        await self.engines.stop(d.endpoint_ids, d.reason)
        return detail
