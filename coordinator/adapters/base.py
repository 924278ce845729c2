"""The one interface every P/D adapter implements, and what an adapter sees of an attempt."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from coordinator.endpoint import Endpoint


class PairAttempt(Protocol):
    """One attempt of a request, as an adapter sees it (`coordinator.proxy.legs.Attempt`):
    what it sends, its engine request id and number, and the legs it is made of. Every leg and
    abort of it carries `rid`, so no adapter names a request id of its own."""

    body: dict[str, Any]  # the body this attempt sends (a continuation's after a break)
    rid: str  # the engine request id: the same on both legs
    number: int  # the attempt's number within its request (bootstrap rooms differ per attempt)

    @property
    def root(self) -> str:
        """The request's own id (a pair's bootstrap room derives from it)."""
        ...

    @property
    def committed(self) -> bool:
        """Whether the client already got the head of an answer."""
        ...

    def prefill_leg(self, p: Endpoint, body: bytes) -> Coroutine[Any, Any, tuple[int, bytes]]: ...

    def serve(self, ep: Endpoint, body: bytes) -> Coroutine[Any, Any, None]: ...

    def refused(self, status: int, body: bytes) -> None: ...

    def abort(self, ep: Endpoint) -> None: ...

    def keep(self, task: asyncio.Task[Any]) -> None: ...


class PDAdapter(Protocol):
    """One P/D protocol: how a request's prefill and decode legs meet, from first leg to last.

    `run` serves the attempt on the pair through its legs (`at.prefill_leg`, `at.serve`,
    `at.abort`); the client gets the decode's answer (or the prefill's refusal of a bad
    request, `at.refused`). It raises `Retry` when the attempt failed before anything reached
    the client (the loop tries another candidate) and lets `Broken` through when the decode
    failed after (the loop continues the stream); both are `coordinator.proxy.outcome`'s. The
    attempt loop counts the request in flight on the decode for the whole attempt, prefill leg
    included; the prefill leg counts itself on the prefill.
    """

    capability: str  # what both halves of a pair register; the registry's key
    native_paths: frozenset[bytes]  # engine paths beyond /v1 generation it can split (seed 003)

    async def run(self, at: PairAttempt, prefill: Endpoint, decode: Endpoint) -> None: ...
