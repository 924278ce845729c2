"""Serving one generation request: the synchronous fast path and the timed/P-D path.

In `--fast` mode, a request that needs no peer and no injected delay is answered inside the
HTTP callback, without a task or a sleep; that path is the floor of the coordinator
benchmark. Everything else runs as a coroutine: P/D rendezvous, admission (waiting for KV
blocks), prefill time, then tokens on the inter-token clock, streamed or collected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from simengine.bootstrap import BootstrapClient, RoomRegistry
from simengine.engine import Engine, Job
from simengine.handoff import HandoffClient, HandoffStore, wants_remote_decode, wants_remote_prefill
from simengine.openai_api import ApiError, GenRequest
from simengine.render import DONE, StreamFormat, full_body, usage
from simengine.router import HandlerResult, Response

log = logging.getLogger(__name__)

SSE = "text/event-stream; charset=utf-8"


class Generator:
    """Turns validated requests into responses on one engine."""

    def __init__(
        self,
        engine: Engine,
        handoff: HandoffStore,
        handoff_client: HandoffClient,
        rooms: RoomRegistry,
        bootstrap_client: BootstrapClient,
    ) -> None:
        self.engine = engine
        self.faults = engine.faults
        self.handoff = handoff
        self.handoff_client = handoff_client
        self.rooms = rooms
        self.bootstrap_client = bootstrap_client

    def handle(self, g: GenRequest) -> HandlerResult:
        """Answer now when possible, else return the coroutine that will."""
        if self.faults.roll_error():
            return Response(500, ApiError(500, "injected fault: error_rate").body())
        if self.engine.suspended:
            raise ApiError(503, "engine is suspended for a container snapshot; POST /resume first")
        if self.engine.asleep:
            raise ApiError(503, "engine is sleeping; POST /wake_up first")
        cap = 1 if g.bootstrap is not None and self.engine.settings.role == "prefill" else None
        job = self.engine.prepare(g, cap)
        if not self.engine.unpaused.is_set():
            return self._held(job)
        if self._can_answer_now(job) and self.engine.try_admit(job):
            return self._answer_now(job)
        return self._answer_later(job)

    def _can_answer_now(self, job: Job) -> bool:
        spec = self.faults.spec
        return (
            self.engine.settings.fast
            and spec.slow_tokens_ms <= 0
            and spec.die_mid_stream is None
            and spec.end_stream_after is None
            and job.g.bootstrap is None
            and not wants_remote_prefill(job)
        )

    # ------------------------------------------------------------------ fast path

    def _answer_now(self, job: Job) -> Response:
        g, plan = job.g, job.plan
        m = self.engine.metrics
        m.ttft.observe(time.monotonic() - job.arrival)
        if plan.completion_tokens > 1:
            m.itl.observe(0.0, plan.completion_tokens - 1)
        kv_params = self.handoff.hold(job) if wants_remote_decode(job) else None
        job.sent = plan.completion_tokens
        self.engine.finish(job, plan.finish_reason)
        use = usage(job.prompt_len, plan.completion_tokens, job.cached_tokens)
        created = int(time.time())
        if not g.stream:
            body = full_body(g, created, plan.text, plan.finish_reason, plan.stop_reason, use, kv_params)
            return Response(200, body, on_sent=self.faults.on_answered)
        fmt = StreamFormat(g, created)
        chunks = [fmt.role()] if g.chat else []
        if g.continuous_usage:
            last = len(plan.pieces) - 1
            for i, piece in enumerate(plan.pieces):
                if i == last:
                    chunks.append(self._chunk(fmt, job, piece, plan.finish_reason, plan.stop_reason, i + 1))
                elif piece:
                    chunks.append(self._chunk(fmt, job, piece, None, None, i + 1))
        else:
            chunks += fmt.all_pieces(plan.pieces, plan.finish_reason, plan.stop_reason)
        if g.include_usage:
            chunks.append(fmt.usage(use))
        chunks.append(DONE)
        # One chunked write per event, as a real engine streams them (not one body).
        return Response(200, content_type=SSE, parts=chunks, on_sent=self.faults.on_answered)

    @staticmethod
    def _chunk(
        fmt: StreamFormat, job: Job, piece: str, finish: str | None, stop: str | None, n: int
    ) -> bytes:
        if job.g.continuous_usage:
            return fmt.piece_with_usage(piece, finish, stop, usage(job.prompt_len, n, job.cached_tokens))
        return fmt.piece(piece, finish, stop)

    # ------------------------------------------------------------------ timed / P-D path

    async def _held(self, job: Job) -> Response:
        """A request that came while generation is paused: it starts once continued."""
        await self.engine.unpaused.wait()
        return await self._answer_later(job)

    async def _answer_later(self, job: Job) -> Response:
        engine = self.engine
        engine.register(job)
        g = job.g
        role = engine.settings.role
        room = g.bootstrap.room if g.bootstrap is not None and role == "prefill" else None
        if room is not None:
            # Whatever ends this prefill early also closes its room, so the decode is released.
            self.rooms.bind(job, room)
        handed_over = False
        try:
            if wants_remote_prefill(job):
                await self.handoff_client.fetch(job)
            if g.bootstrap is not None and role == "decode":
                await self.bootstrap_client.claim(job, g.bootstrap, engine.settings.bootstrap_timeout_s)
            await engine.admit(job)
            if not job.aborted:
                await engine.prefill(job)
            kv_params: dict[str, Any] | None = None
            if room is not None and not job.aborted:
                await self.rooms.serve(job, room)
            elif wants_remote_decode(job) and not job.aborted:
                kv_params = self.handoff.hold(job)
            engine.metrics.ttft.observe(time.monotonic() - job.arrival)
            if g.stream:
                handed_over = True
                return Response(
                    200, content_type=SSE, stream=self._stream(job), on_sent=self.faults.on_answered
                )
            text = await self._collect(job)
            finish, stop = self._finish_reason(job)
            engine.finish(job, finish)
            handed_over = True
            use = usage(job.prompt_len, job.sent, job.cached_tokens)
            body = full_body(g, int(time.time()), text, finish, stop, use, kv_params)
            return Response(200, body, on_sent=self.faults.on_answered)
        except ApiError as exc:
            engine.finish(job, "error")
            handed_over = True
            return Response(exc.status, exc.body())
        finally:
            if room is not None:
                self.rooms.abort(room, f"prefill request {g.rid} ended before a decode claimed it")
            if not handed_over:
                engine.finish(job, "abort")

    def _finish_reason(self, job: Job) -> tuple[str, str | None]:
        if job.aborted and job.sent < job.plan.completion_tokens:
            return "abort", None
        return job.plan.finish_reason, job.plan.stop_reason

    async def _collect(self, job: Job) -> str:
        pieces = job.plan.pieces
        parts: list[str] = []
        itl = self.engine.metrics.itl
        for i, piece in enumerate(pieces):
            if job.aborted:
                break
            if i > 0:
                gap = self.engine.itl_seconds()
                await self.engine.pause(job, gap)
                if job.aborted:
                    break
                itl.observe(gap)
            parts.append(piece)
            job.sent = i + 1
        return "".join(parts)

    async def _stream(self, job: Job) -> AsyncIterator[bytes]:
        engine, g, plan = self.engine, job.g, job.plan
        fmt = StreamFormat(g, int(time.time()))
        finished = cut = False
        try:
            if g.chat:
                yield fmt.role()
            last = len(plan.pieces) - 1
            for i, piece in enumerate(plan.pieces):
                self.faults.check_mid_stream(job.sent)
                if self.faults.ends_early(job.sent):
                    cut = True
                    break
                if i > 0:
                    gap = engine.itl_seconds()
                    await engine.pause(job, gap)
                    engine.metrics.itl.observe(gap)
                if job.aborted:
                    break
                job.sent = i + 1
                if i == last:
                    yield self._chunk(fmt, job, piece, plan.finish_reason, plan.stop_reason, i + 1)
                elif piece:
                    yield self._chunk(fmt, job, piece, None, None, i + 1)
            finish, _ = ("abort", None) if cut else self._finish_reason(job)
            if finish == "abort" and not cut:
                yield self._chunk(fmt, job, "", "abort", None, job.sent)
            if g.include_usage:
                yield fmt.usage(usage(job.prompt_len, job.sent, job.cached_tokens))
            yield DONE
            engine.finish(job, finish)
            finished = True
        finally:
            if not finished:
                # The client went away (or the server is stopping): free the request.
                engine.abort_job(job)
                engine.finish(job, "abort")


async def close_all(gen: Generator) -> None:
    """Release the P/D resources of a generator at shutdown."""
    gen.handoff.clear()
    gen.rooms.clear()
    await asyncio.gather(gen.handoff_client.close(), gen.bootstrap_client.close())
