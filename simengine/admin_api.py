"""The engine-admin routes fleet operations call (`nodeagent.engine_ops`), with real effects.

Both spellings where they do not collide with the builtin engine's own routes:
- cache: vLLM `POST /reset_prefix_cache` (SGLang's `/flush_cache` is `simengine.app`'s): the
  cached prefixes no request holds are forgotten (the KV model empties).
- pause: SGLang `POST /pause_generation` / `/continue_generation`, vLLM `POST /pause`
  (vLLM's `/resume` is the container snapshot's route here): new requests wait until continued.
- sleep: vLLM `POST /sleep?level=1|2`, `POST /wake_up`, `GET /is_sleeping`; SGLang
  `/release_memory_occupation`, `/resume_memory_occupation`: asleep, generation answers 503
  and the KV cache is dropped.
- weights: SGLang `POST /update_weights_from_disk {model_path}`, vLLM `POST /collective_rpc
  {"method": "reload_weights"}`: the weights version (in `GET /admin/engine_state` and each
  model's `weights_version` in `/v1/models`) goes up by one.
- LoRA: vLLM `POST /v1/load_lora_adapter {lora_name, lora_path}`, `/v1/unload_lora_adapter
  {lora_name}`, SGLang `/load_lora_adapter`, `/unload_lora_adapter`: the adapter is served
  under its name (listed in `/v1/models`, answers `model: NAME`); its path must be a directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from http1.request import Request
from simengine.engine import Engine
from simengine.openai_api import ApiError, parse_json
from simengine.router import Response, json_response


class AdminApi:
    """Handlers over the engine core and the served LoRA adapters (name -> path)."""

    def __init__(self, engine: Engine, adapters: dict[str, str]) -> None:
        self.engine = engine
        self.adapters = adapters

    def routes(self) -> list[tuple[str, str, Any]]:
        """(method, path, handler) of every route here."""
        return [
            ("POST", "/reset_prefix_cache", self.reset_prefix_cache),
            ("POST", "/pause_generation", self.pause),
            ("POST", "/pause", self.pause),
            ("POST", "/continue_generation", self.continue_),
            ("POST", "/sleep", self.sleep),
            ("POST", "/release_memory_occupation", self.sleep),
            ("POST", "/wake_up", self.wake),
            ("POST", "/resume_memory_occupation", self.wake),
            ("GET", "/is_sleeping", lambda req: json_response({"is_sleeping": self.engine.asleep})),
            ("POST", "/update_weights_from_disk", self.update_weights),
            ("POST", "/collective_rpc", self.collective_rpc),
            ("POST", "/v1/load_lora_adapter", self.load_lora),
            ("POST", "/load_lora_adapter", self.load_lora),
            ("POST", "/v1/unload_lora_adapter", self.unload_lora),
            ("POST", "/unload_lora_adapter", self.unload_lora),
            ("GET", "/admin/engine_state", self.state),
        ]

    def state(self, req: Request) -> Response:
        e = self.engine
        return json_response(
            {
                "asleep": e.asleep,
                "paused": not e.unpaused.is_set(),
                "weights_version": e.weights_version,
                "cached_blocks": e.pool.cached_blocks(),
                "adapters": dict(sorted(self.adapters.items())),
            }
        )

    def reset_prefix_cache(self, req: Request) -> Response:
        self.engine.pool.reset_cache()
        return Response(200, content_type="text/plain")

    def pause(self, req: Request) -> Response:
        self.engine.unpaused.clear()
        return json_response({"success": True, "message": "generation paused"})

    def continue_(self, req: Request) -> Response:
        self.engine.unpaused.set()
        return json_response({"success": True, "message": "generation continued"})

    def sleep(self, req: Request) -> Response:
        level = req.query_params().get("level", "1")
        if level not in ("1", "2"):
            raise ApiError(400, f"level must be 1 or 2, got {level!r}", param="level")
        self.engine.asleep = True
        self.engine.pool.reset_cache()  # both levels discard the KV cache
        return Response(200, content_type="text/plain")

    def wake(self, req: Request) -> Response:
        self.engine.asleep = False
        return Response(200, content_type="text/plain")

    def update_weights(self, req: Request) -> Response:
        body = parse_json(req.body)
        path = body.get("model_path") if isinstance(body, dict) else None
        if path is not None and not isinstance(path, str):
            raise ApiError(400, "model_path must be a string", param="model_path")
        return self._reloaded()

    def collective_rpc(self, req: Request) -> Response:
        body = parse_json(req.body)
        method = body.get("method") if isinstance(body, dict) else None
        if method != "reload_weights":
            raise ApiError(
                400, f"method {method!r} is not one this engine runs (reload_weights)", param="method"
            )
        return self._reloaded()

    def _reloaded(self) -> Response:
        self.engine.weights_version += 1
        self.engine.pool.reset_cache()  # cached KV of the old weights is wrong now
        return json_response({"success": True, "weights_version": self.engine.weights_version})

    def load_lora(self, req: Request) -> Response:
        body = _body(req)
        name, path = _name(body), body.get("lora_path")
        if not isinstance(path, str) or not path:
            raise ApiError(400, "lora_path must be a non-empty string", param="lora_path")
        if name in self.adapters:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        if not Path(path).is_dir():
            raise ApiError(400, f"lora_path {path!r} is not a directory", param="lora_path")
        self.adapters[name] = path
        return Response(200, f"Success: LoRA adapter '{name}' added successfully.".encode(), "text/plain")

    def unload_lora(self, req: Request) -> Response:
        name = _name(_body(req))
        if self.adapters.pop(name, None) is None:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name")
        return Response(200, f"Success: LoRA adapter '{name}' removed successfully.".encode(), "text/plain")


def _body(req: Request) -> dict[str, Any]:
    body = parse_json(req.body)
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _name(body: dict[str, Any]) -> str:
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "lora_name must be a non-empty string", param="lora_name")
    return name
