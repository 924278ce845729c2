"""The one interface every scheduling policy implements, and what a policy sees of a request."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

import orjson

from coordinator.table import Endpoint

# Bytes of the prompt a policy may look at: enough for a long shared system prompt.
PREFIX_LIMIT = 8192


class RequestInfo:
    """What a policy may know about a request.

    `prefix` is the start of the prompt in a stable serialisation (see `prompt_prefix`);
    given a `body` instead, it is computed on first use, so only a policy that reads it pays.
    """

    __slots__ = ("_prefix", "body", "model", "request_id")

    def __init__(
        self,
        model: str | None,
        prefix: bytes | None,
        request_id: str,
        body: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self._prefix = prefix
        self.request_id = request_id
        self.body = body

    @property
    def prefix(self) -> bytes:
        """The prompt's first bytes (computed from `body` once, when a policy asks)."""
        p = self._prefix
        if p is None:
            p = self._prefix = prompt_prefix(self.body) if self.body is not None else b""
        return p


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
