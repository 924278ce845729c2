"""The one interface every scheduling policy implements, and what a policy sees of a request."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from coordinator.table import Endpoint

# Bytes of the prompt a policy may look at: enough for a long shared system prompt.
PREFIX_LIMIT = 8192


@dataclass(slots=True)
class RequestInfo:
    """What a policy may know about a request."""

    model: str | None
    prefix: bytes  # the start of the prompt, in a stable serialisation (see `prompt_prefix`)
    request_id: str


class Policy(Protocol):
    """Pick one endpoint for a request, or None when every candidate is excluded."""

    name: str
    uses_prefix: bool  # False: the caller may pass an empty prefix and skip computing it

    def select(
        self, endpoints: Sequence[Endpoint], req: RequestInfo, exclude: Collection[str] = ()
    ) -> Endpoint | None: ...


def prompt_prefix(body: dict[str, Any], limit: int = PREFIX_LIMIT) -> bytes:
    """The prompt of an OpenAI body (`messages`, `prompt` or `input`) as bytes, cut at `limit`."""
    for field in ("messages", "prompt", "input"):
        value = body.get(field)
        if value is not None:
            if isinstance(value, str):
                return value.encode()[:limit]
            try:
                return orjson.dumps(value)[:limit]
            except TypeError:
                return b""
    return b""


def allowed(endpoints: Sequence[Endpoint], exclude: Collection[str]) -> Sequence[Endpoint]:
    """The endpoints whose key is not excluded (the same sequence when nothing is)."""
    if not exclude:
        return endpoints
    return [e for e in endpoints if e.key not in exclude]
