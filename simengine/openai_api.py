"""Parse and validate OpenAI requests the way vLLM does; shape its error bodies.

Pure functions from a decoded JSON body to a `GenRequest`. Every rejection is an `ApiError`
naming the field, which the server turns into `{"error": {"message", "type", "param",
"code"}}` with the HTTP status (400 for bad parameters, 404 for an unknown model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import orjson

from core.http_errors import engine_error, error_types
from simengine.textgen import Sampling
from simengine.tokenizer import TemplateError, render_chat


class ApiError(Exception):
    """A request the engine refuses, with the HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, type_: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or error_types(status).engine
        self.param = param

    def body(self) -> bytes:
        """The OpenAI-shaped JSON error body."""
        return error_body(self.status, self.message, self.type, self.param)


def error_body(status: int, message: str, type_: str, param: str | None = None) -> bytes:
    """`{"error": {"message", "type", "param", "code"}}` as vLLM sends it."""
    return engine_error(status, message, type_=type_, param=param)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """SGLang P/D rendezvous: where the prefill engine's bootstrap server is, and the room."""

    host: str
    port: int
    room: int


@dataclass(slots=True)
class GenRequest:
    """A validated generation request (chat or completion)."""

    chat: bool
    rid: str
    model: str
    prompt_text: str | None  # the prompt (or rendered chat); None when given as token ids
    prompt_ids: tuple[int, ...] | None  # the prompt's token ids, when given so
    max_tokens: int | None
    sampling: Sampling
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer: dict[str, Any] | None
    bootstrap: Bootstrap | None
    max_tokens_field: str = "max_tokens"  # the body field `max_tokens` came from (errors name it)


def parse_json(body: bytes) -> dict[str, Any]:
    """Decode a JSON object body or raise a 400."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object")
    return obj


def _int(body: dict[str, Any], key: str, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ApiError(400, f"{key} must be an integer, got {v!r}", param=key)
    if lo is not None and v < lo:
        raise ApiError(400, f"{key} must be at least {lo}, got {v}.", param=key)
    return v


def _num(body: dict[str, Any], key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise ApiError(400, f"{key} must be a number, got {v!r}", param=key)
    return float(v)


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{key} must be a boolean, got {v!r}", param=key)
    return v


def check_model(body: dict[str, Any], names: tuple[str, ...]) -> str:
    """The model the request names (default: the served one); 404 for an unknown one."""
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    if model not in names:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")
    return model


def _sampling(body: dict[str, Any]) -> Sampling:
    temperature = _num(body, "temperature", 1.0)
    if temperature < 0:
        raise ApiError(400, f"temperature must be non-negative, got {temperature}.", param="temperature")
    top_p = _num(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    n = _int(body, "n", lo=1)
    if n is not None and n > 1:
        raise ApiError(400, "n > 1 is not supported by the builtin engine; send n=1", param="n")
    return Sampling(
        temperature=temperature,
        top_p=top_p,
        seed=_int(body, "seed"),
        stop=stops,
        ignore_eos=_bool(body, "ignore_eos"),
        min_tokens=_int(body, "min_tokens", lo=0) or 0,
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output"),
    )


def _bootstrap(body: dict[str, Any]) -> Bootstrap | None:
    keys = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    present = [k for k in keys if body.get(k) is not None]
    if not present:
        return None
    if len(present) != 3:
        missing = [k for k in keys if k not in present]
        raise ApiError(
            400, f"SGLang P/D needs bootstrap_host, bootstrap_port and bootstrap_room; missing {missing}"
        )
    host = body["bootstrap_host"]
    if not isinstance(host, str) or not host:
        raise ApiError(400, "bootstrap_host must be a non-empty string", param="bootstrap_host")
    port = _int(body, "bootstrap_port", lo=1)
    room = _int(body, "bootstrap_room", lo=0)
    assert port is not None and room is not None
    return Bootstrap(host, port, room)


def _request_id(body: dict[str, Any], header_rid: str | None) -> str:
    for key in ("rid", "request_id"):
        v = body.get(key)
        if v is not None:
            if not isinstance(v, str) or not v:
                raise ApiError(400, f"{key} must be a non-empty string", param=key)
            return v
    return header_rid or os.urandom(16).hex()


def _common(
    body: dict[str, Any],
    chat: bool,
    names: tuple[str, ...],
    text: str | None,
    ids: tuple[int, ...] | None,
    rid: str | None,
) -> GenRequest:
    max_tokens = _int(body, "max_tokens", lo=1)
    field = "max_tokens"
    if chat:
        completion = _int(body, "max_completion_tokens", lo=1)
        if completion is not None:
            max_tokens, field = completion, "max_completion_tokens"
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = continuous = False
    if opts is not None:
        if not stream:
            raise ApiError(
                400, "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if not isinstance(opts, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        include_usage = _bool(opts, "include_usage")
        continuous = _bool(opts, "continuous_usage_stats")
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise ApiError(400, "kv_transfer_params must be an object", param="kv_transfer_params")
    return GenRequest(
        chat=chat,
        rid=_request_id(body, rid),
        model=check_model(body, names),
        prompt_text=text,
        prompt_ids=ids,
        max_tokens=max_tokens,
        sampling=_sampling(body),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        kv_transfer=kv,
        bootstrap=_bootstrap(body),
        max_tokens_field=field,
    )


def parse_chat(body: dict[str, Any], names: tuple[str, ...], header_rid: str | None = None) -> GenRequest:
    """Validate a `/v1/chat/completions` body."""
    if "messages" not in body:
        raise ApiError(400, "messages is required", param="messages")
    try:
        cont = _bool(body, "continue_final_message")
        text = render_chat(body["messages"], _bool(body, "add_generation_prompt", not cont), cont)
    except TemplateError as exc:
        raise ApiError(400, str(exc), param="messages") from None
    return _common(body, True, names, text, None, header_rid)


def _prompt(prompt: Any) -> tuple[str | None, tuple[int, ...] | None]:
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        return prompt, None
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return None, tuple(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt(prompt[0])
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        raise ApiError(
            400, "batched prompts are not supported by the builtin engine; send one prompt", param="prompt"
        )
    raise ApiError(
        400,
        "prompt must be a non-empty string, a list of token ids, or a list with one of those",
        param="prompt",
    )


def parse_completion(
    body: dict[str, Any], names: tuple[str, ...], header_rid: str | None = None
) -> GenRequest:
    """Validate a `/v1/completions` body."""
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", param="prompt")
    text, ids = _prompt(body["prompt"])
    return _common(body, False, names, text, ids, header_rid)
