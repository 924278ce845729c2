"""The builtin engine's HTTP surface: OpenAI API, health, metrics, SGLang/vLLM extras, admin.

`BuiltinEngine` owns every piece of one engine process (no module globals); `routes()` maps
paths to its handlers, `run()` serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from http1.listen import Server
from http1.metrics import HttpCollector
from http1.request import Request
from simengine.admin_api import AdminApi
from simengine.bootstrap import BootstrapClient, RoomRegistry
from simengine.embeddings import embeddings_body
from simengine.engine import Engine
from simengine.generation import Generator, close_all
from simengine.handoff import TRANSFER_PATH, HandoffClient, HandoffStore
from simengine.injection import FaultError, Faults
from simengine.kvpublish import KvEventsOptions, KvPublisher
from simengine.metaserver import MetaServer
from simengine.native_api import NativeApi
from simengine.openai_api import ApiError, GenRequest, parse_chat, parse_completion, parse_json
from simengine.options import EngineOptions
from simengine.render import models_body
from simengine.router import HandlerResult, Response, Router, json_response, start_server
from simengine.vllm_metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

VERSION = "0.1.0-builtin"
SEEN = 64  # generation requests `GET /admin/requests` lists, newest last


def _on_error(exc: Exception) -> Response | None:
    # An ApiError is the engine's answer; anything else is a bug: the server core answers 500
    # and logs it (as it logs a 5xx ApiError) with the request's id.
    if isinstance(exc, ApiError):
        return Response(exc.status, exc.body())
    return None


class BuiltinEngine:
    """One builtin engine: the simulated core plus its HTTP handlers."""

    def __init__(self, settings: EngineOptions) -> None:
        self.settings = settings
        self.names = settings.model_names
        self.faults = Faults(settings.faults)
        self.engine = Engine(settings, self.faults)
        self.handoff = HandoffStore(self.engine)
        self.rooms = RoomRegistry(self.engine)
        self.gen = Generator(self.engine, self.handoff, HandoffClient(), self.rooms, BootstrapClient())
        self.metaserver = MetaServer()
        self.started = int(time.time())
        self.snapshot_state = "running"  # running | suspended | unlocked
        self._stop = asyncio.Event()
        self._servers: list[Server] = []
        self.seen: deque[GenRequest] = deque(maxlen=SEEN)  # what tests ask: which requests came
        self.kv_events: KvPublisher | None = None
        self.adapters: dict[str, str] = {}  # LoRA adapters loaded at run time: name -> path

    # ------------------------------------------------------------------ routing

    def routes(self) -> Router:
        """Every path the engine serves on its business port."""
        r = Router()
        r.add("POST", "/v1/completions", self.completions)
        r.add("POST", "/v1/chat/completions", self.chat)
        r.add("POST", "/v1/embeddings", self.embeddings)
        r.add("GET", "/v1/models", self.models)
        r.add("GET", "/v1/models/*", self.model_one)
        r.add("GET", "/health", self.health)
        r.add("GET", "/health_generate", self.health)
        r.add("GET", "/ping", self.health)
        r.add("GET", "/metrics", self.metrics)
        r.add("GET", "/version", lambda req: json_response({"version": VERSION}))
        r.add(
            "GET",
            "/load",
            lambda req: json_response({"server_load": self.engine.running + len(self.engine.waiting)}),
        )
        r.add("GET", "/get_load", self.get_load)
        r.add("POST", "/abort_request", self.abort_request)
        r.add("POST", "/flush_cache", self.flush_cache)
        r.add("GET", "/server_info", self.server_info)
        r.add("GET", "/get_server_info", self.server_info)
        r.add("GET", "/model_info", self.model_info)
        r.add("GET", "/get_model_info", self.model_info)
        r.add("GET", "/fault_tolerance/status", self.ft_status)
        r.add("POST", "/suspend", self.suspend)
        r.add("POST", "/device_unlock", self.device_unlock)
        r.add("POST", "/resume", self.resume)
        r.add("GET", "/admin/faults", lambda req: json_response(self.faults.as_dict()))
        r.add("POST", "/admin/faults", self.set_faults)
        r.add("POST", "/admin/kv_events", self.kv_event_faults)
        r.add("GET", "/admin/requests", self.requests_seen)
        r.add("POST", TRANSFER_PATH, self.kv_transfer)
        r.add("POST", "/v1/metaserver", self.metaserver_forward)
        for method, path, handler in NativeApi(self.gen, self.names, self.settings.max_model_len).routes():
            r.add(method, path, handler)  # seed 003: /generate, /v1/score, /v1/rerank, /tokenize ...
        for method, path, handler in AdminApi(self.engine, self.adapters).routes():
            r.add(method, path, handler)  # fleet operations: sleep, pause, reload, LoRA ...
        return r

    # ------------------------------------------------------------------ OpenAI API

    def completions(self, req: Request) -> HandlerResult:
        g = parse_completion(parse_json(req.body), self.served, req.header(b"x-request-id"))
        self.seen.append(g)
        return self.gen.handle(g)

    def chat(self, req: Request) -> HandlerResult:
        g = parse_chat(parse_json(req.body), self.served, req.header(b"x-request-id"))
        self.seen.append(g)
        return self.gen.handle(g)

    def requests_seen(self, req: Request) -> Response:
        """The last generation requests this engine parsed (a test's view of what came)."""
        rows = [(g.rid, g.chat, g.stream, g.prompt_text, g.max_tokens) for g in self.seen]
        return json_response(
            [dict(zip(("rid", "chat", "stream", "prompt", "max_tokens"), r, strict=True)) for r in rows]
        )

    def embeddings(self, req: Request) -> Response:
        return json_response(
            embeddings_body(parse_json(req.body), self.names, self.settings.embedding_dim, req.body)
        )

    @property
    def served(self) -> tuple[str, ...]:
        """The model names a request may name: the served ones, then the LoRA adapters loaded."""
        return self.names + tuple(sorted(self.adapters))

    def models(self, req: Request) -> Response:
        return Response(200, models_body(self.served, self.started, self.settings.max_model_len))

    def model_one(self, req: Request) -> Response:
        name = req.path[len(b"/v1/models/") :].decode("latin-1")
        if name not in self.served:
            raise ApiError(404, f"The model `{name}` does not exist.", param="model")
        data = orjson.loads(models_body((name,), self.started, self.settings.max_model_len))["data"][0]
        return json_response(data)

    # ------------------------------------------------------------------ health and load

    def health(self, req: Request) -> HandlerResult:
        fault = self.faults.health_fault()
        if fault == "hang":
            return self._hang()
        if isinstance(fault, int) and fault != 200:
            raise ApiError(fault, f"health answers {fault} (injected fault)")
        if self.faults.spec.ft_status == "dead":
            raise ApiError(503, "engine is dead (injected fault)")
        return Response(200)

    async def _hang(self) -> Response:
        # Never answers; the connection's close cancels this.
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    def metrics(self, req: Request) -> Response:
        return Response(200, self.engine.metrics.render(), CONTENT_TYPE)

    def get_load(self, req: Request) -> Response:
        e = self.engine
        used_tokens = e.pool.used * self.settings.block_size
        return json_response(
            [{"dp_rank": 0, "num_reqs": e.running + len(e.waiting), "num_waiting_reqs": len(e.waiting),
              "num_tokens": used_tokens}]
        )  # fmt: skip

    def ft_status(self, req: Request) -> Response:
        status = self.faults.spec.ft_status
        reason = None if status == "healthy" else "injected fault"
        return json_response({"status": status, "reason": reason, "engine_id": self.settings.engine_id})

    def server_info(self, req: Request) -> Response:
        s, e = self.settings, self.engine
        mode = "null" if s.role == "union" else s.role
        return json_response(
            {
                "model_path": s.model,
                "served_model_name": s.model,
                "tokenizer_path": s.model,
                "host": s.host,
                "port": s.port,
                "engine_id": s.engine_id,
                "role": s.role,
                "disaggregation_mode": mode,
                "disaggregation_bootstrap_port": s.bootstrap_port,
                "tp_size": 1,
                "dp_size": 1,
                "context_length": s.max_model_len,
                "max_total_num_tokens": s.num_blocks * s.block_size,
                "max_running_requests": s.max_num_seqs,
                "page_size": s.block_size,
                "fast": s.fast,
                "internal_states": [
                    {"num_running_reqs": e.running, "num_waiting_reqs": len(e.waiting),
                     "kv_cache_usage": e.pool.usage()}
                ],
                "version": VERSION,
                "simulator": "motor-builtin-simulator",
            }
        )  # fmt: skip

    def model_info(self, req: Request) -> Response:
        s = self.settings
        return json_response(
            {
                "model_path": s.model,
                "tokenizer_path": s.model,
                "served_model_name": s.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "motor-builtin-simulator",
                "architectures": ["MotorBuiltinSimulator"],
                "max_model_len": s.max_model_len,
            }
        )

    # ------------------------------------------------------------------ control

    def abort_request(self, req: Request) -> Response:
        body = parse_json(req.body) if req.body else {}
        if body.get("abort_all") is True:
            return json_response({"aborted": self.engine.abort_all()})
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, "rid must be a non-empty string (or send abort_all: true)", param="rid")
        return json_response({"aborted": int(self.engine.abort(rid))})

    def flush_cache(self, req: Request) -> Response:
        self.engine.pool.reset_cache()
        return Response(200, b"Cache flushed.", "text/plain")

    def kv_event_faults(self, req: Request) -> Response:
        """`{"drop": N, "garbage": M}`: the next N KV event batches skip the PUB socket (the
        replay socket still has them) and M malformed messages go out now."""
        body = parse_json(req.body)
        if self.kv_events is None:
            raise ApiError(400, "this engine publishes no KV events (--kv-events-config)")
        drop, garbage = (body.get(k, 0) if isinstance(body, dict) else None for k in ("drop", "garbage"))
        if not all(type(v) is int and v >= 0 for v in (drop, garbage)):
            raise ApiError(400, "drop and garbage must be non-negative integers")
        assert isinstance(drop, int) and isinstance(garbage, int)
        self.kv_events.skip_seqs += drop
        self.kv_events.send_garbage(garbage)
        return json_response({"drop": self.kv_events.skip_seqs, "garbage": garbage})

    def set_faults(self, req: Request) -> Response:
        try:
            self.faults.update(parse_json(req.body))
        except FaultError as exc:
            raise ApiError(400, str(exc)) from None
        return json_response(self.faults.as_dict())

    async def metaserver_forward(self, req: Request) -> Response:
        return await self.metaserver.forward(parse_json(req.body))

    def kv_transfer(self, req: Request) -> Response:
        status, answer = self.handoff.transfer(parse_json(req.body))
        return json_response(answer, status)

    # ------------------------------------------------------------------ container snapshot (seed 000)

    def suspend(self, req: Request) -> Response:
        path = req.query_params().get("model_save_path")
        if not path:
            raise ApiError(400, "model_save_path is required", param="model_save_path")
        try:
            target = Path(path)
            target.mkdir(parents=True, exist_ok=True)
            meta = {
                "model": self.settings.model,
                "engine_id": self.settings.engine_id,
                "saved_at": time.time(),
            }
            (target / "builtin-weights.json").write_bytes(orjson.dumps(meta))
        except OSError as exc:
            raise ApiError(500, f"cannot save weights to {path}: {exc.strerror}") from None
        self.engine.suspended = True
        self.snapshot_state = "suspended"
        return Response(200, content_type="text/plain")

    def device_unlock(self, req: Request) -> Response:
        self.snapshot_state = "unlocked"
        return Response(200, content_type="text/plain")

    def resume(self, req: Request) -> Response:
        q = req.query_params()
        for name in ("data_parallel_master_ip", "model_path"):
            if not q.get(name):
                raise ApiError(400, f"{name} is required", param=name)
        self.engine.suspended = False
        self.snapshot_state = "running"
        return Response(200, content_type="text/plain")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind the business port (and the bootstrap port of a prefill engine)."""
        s = self.settings
        http = HttpCollector("motor_engine")
        self.engine.metrics.registry.register(http)
        self._servers.append(
            await start_server(self.routes(), s.host, s.port, _on_error, limits=s.http, collector=http)
        )
        kv_opts = KvEventsOptions.from_config(s.kv_events) if s.kv_events is not None else None
        if kv_opts is not None:
            self.kv_events = KvPublisher(kv_opts)
            self.kv_events.start()
            self.engine.pool.listener = self.kv_events.push
        if s.bootstrap_port is not None:
            self._servers.append(
                await start_server(
                    self.rooms.routes(), s.host, s.bootstrap_port, _on_error, limits=s.http, collector=http
                )
            )
        log.info(
            "builtin engine %s (%s, %s) serving %s on %s:%d%s",
            s.engine_id, s.role, "fast" if s.fast else "timed", s.model, s.host, s.port,
            f", bootstrap port {s.bootstrap_port}" if s.bootstrap_port is not None else "",
        )  # fmt: skip

    def stop(self) -> None:
        """Ask `run()` to return."""
        self._stop.set()

    async def close(self) -> None:
        for server in self._servers:
            await server.stop()
        await close_all(self.gen)
        await self.metaserver.close()
        self._servers.clear()
        if self.kv_events is not None:
            self.engine.pool.listener = None
            await self.kv_events.close()
            self.kv_events = None

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        await self.start()
        # Startup objects live for the whole process: keep the collector from rescanning them.
        gc.freeze()
        print(f"READY builtin engine on http://{self.settings.host}:{self.settings.port}", flush=True)
        try:
            await self._stop.wait()
        finally:
            await self.close()


def serve(settings: EngineOptions) -> int:
    """Run one engine process until it is told to stop; returns the exit code."""
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    engine = BuiltinEngine(settings)
    try:
        runner(engine.run())
    except OSError as exc:
        print(f"builtin engine: cannot serve on {settings.host}:{settings.port}: {exc.strerror}", flush=True)
        return 1
    return 0
