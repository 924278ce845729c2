"""How an attempt fails, as the attempt loop tells the two apart: before anything reached the
client (`Retry`: try another candidate) or after (`Broken`: the stream is cut, ended or
continued elsewhere, `resume.py`)."""

from __future__ import annotations

from coordinator.endpoint import Endpoint
from coordinator.proxy.upstream import UpstreamConn, UpstreamError


class Retry(Exception):
    """An attempt failed before anything was committed to the client (on `ep`, when known).

    `cause` is the engine failure a delivery met while it read the answer: the leg charges
    `ep`'s circuit with it."""

    def __init__(
        self,
        reason: str,
        status: int = 502,
        body: bytes | None = None,
        ep: Endpoint | None = None,
        cause: UpstreamError | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.body = body
        self.ep = ep
        self.cause = cause

    @property
    def kind(self) -> str:
        """http_5xx | timeout | transport | left | slow, for metrics and the fault log."""
        cause = self.cause
        if cause is not None and (cause.left or cause.lost):
            return cause.kind
        if self.body is not None:
            return "http_5xx"
        return "timeout" if self.status == 504 else "transport"


class Broken(Exception):
    """The engine failed after the response was committed to the client (or, for a folded
    whole answer, after its stream began)."""

    def __init__(self, up: UpstreamConn, ep: Endpoint, exc: UpstreamError) -> None:
        super().__init__(str(exc))
        self.up = up
        self.ep = ep
        self.exc = exc
