"""One client request in flight: what the flows share, and how its bytes reach the client.

`Call` carries the parsed body, the root request id (always the coordinator's own), the
client's `x-request-id` (echoed, logged, never sent to an engine), the endpoints tried, and
whether the response is committed (head written: from then on a failure cannot become a clean
retry). Its answers speak the client's API: errors are Anthropic-shaped on /v1/messages.
A `Sink` (`client_sinks.py`) turns an engine's decoded body into client bytes when the proxy cannot
pass the bytes through untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinator.table import Endpoint, Incarnation
from core.http_errors import (
    anthropic_error,
    anthropic_from,
    anthropic_sse_error,
    openai_error,
    openai_sse_error,
)
from http1.request import Request
from http1.server import ClientConn

if TYPE_CHECKING:
    from coordinator.proxy.client_sinks import Sink
    from coordinator.proxy.continuation import Progress
    from coordinator.proxy.wholefold import WholeFold

# Body fields that steer an engine's identity or P/D transfer: only the coordinator sets them
# (a client's `rid` would pick the engine's request id; its `kv_transfer_params` or
# `bootstrap_host` would send an engine to fetch KV from a host of the client's choice).
RESERVED = frozenset(
    {"rid", "request_id", "bootstrap_host", "bootstrap_port", "bootstrap_room", "kv_transfer_params"}
)

# What a client's x-request-id may be to be echoed: one short token of visible ASCII.
_MAX_CLIENT_ID = 128


def client_request_id(headers: dict[bytes, bytes]) -> str | None:
    """The client's `x-request-id` when it is fit to echo in a header and a log line, else None."""
    raw = headers.get(b"x-request-id")
    if raw is None or not 0 < len(raw) <= _MAX_CLIENT_ID:
        return None
    if not all(0x21 <= c <= 0x7E for c in raw):
        return None
    return raw.decode("ascii")


class Retry(Exception):
    """An attempt failed before anything was committed to the client (on `ep`, when known)."""

    def __init__(
        self, reason: str, status: int = 502, body: bytes | None = None, ep: Endpoint | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.body = body
        self.ep = ep

    @property
    def kind(self) -> str:
        """http_5xx | timeout | transport, for metrics and the fault log."""
        if self.body is not None:
            return "http_5xx"
        return "timeout" if self.status == 504 else "transport"


class Call:
    """Per-request state shared by the single-hop and P/D flows."""

    __slots__ = (
        "anthropic",
        "attempts",
        "body",
        "client_id",
        "committed",
        "conn",
        "exclude",
        "excluded_as",
        "fold",
        "model",
        "origin",
        "path",
        "prefill_by",
        "progress",
        "raw",
        "req",
        "resp_body",
        "resuming",
        "root",
        "root_b",
        "route",
        "served_by",
        "sink",
        "status",
        "stream",
        "t0",
        "ttft",
    )

    def __init__(
        self,
        conn: ClientConn,
        req: Request,
        route: str,
        path: bytes,
        body: dict[str, Any],
        raw: bytes,
        root: str,
        client_id: str | None = None,
    ) -> None:
        self.conn = conn
        self.req = req
        self.route = route
        self.path = path  # the engine path (/v1/chat/completions for Anthropic requests)
        self.body = body
        self.origin = body  # continuations are built from this plus all text so far
        self.raw = raw  # the body as sent to a single-hop engine (the client's bytes if untouched)
        model = body.get("model")
        self.model: str | None = model if isinstance(model, str) else None
        self.stream = body.get("stream") is True
        self.root = root  # the coordinator's id: engine request ids and bootstrap rooms derive from it
        self.client_id = client_id
        # What the response's x-request-id says: the client's own id when it sent one.
        self.root_b = (client_id or root).encode()
        self.exclude: set[str] = set()  # endpoints that failed this request (policies skip them)
        self.excluded_as: dict[str, Incarnation | None] = {}  # ... as which process they failed
        self.committed = False
        self.status = 0
        self.t0 = time.perf_counter()
        self.ttft: float | None = None
        self.sink: Sink | None = None
        self.anthropic = False
        self.progress: Progress | None = None
        self.fold: WholeFold | None = None  # a whole answer asked as a stream (`wholefold.py`)
        self.served_by: Endpoint | None = None  # the endpoint whose response the client got
        self.prefill_by: Endpoint | None = None  # its prefill peer in P/D
        self.resp_body: list[bytes] | None = None  # that response's decoded body (detector)
        self.attempts = 0  # engine attempts so far, continuations included (request ids stay unique)
        self.resuming: str | None = None  # the endpoint a stream broke on, until it goes on elsewhere

    @property
    def tag(self) -> str:
        """How log lines name this request: our id, and the client's when it sent one."""
        return self.root if self.client_id is None else f"{self.root} (x-request-id {self.client_id})"

    def readmit(self, current: Callable[[str], Incarnation | None]) -> list[str]:
        """Endpoints this request excluded that `current` now says are another process than the
        one that failed it: candidates again (the failure was the old process's, as its
        circuit was). Returns them. An exclusion is tied to the process `current` names the
        first time it is seen here: the flows ask before every choice, with no wait between a
        failure and the next choice, so that is the process that failed."""
        if not self.exclude:
            return []
        seen = self.excluded_as
        back = []
        for key in list(self.exclude):
            now = current(key)
            if key not in seen:
                seen[key] = now
            elif seen[key] != now:
                back.append(key)
                del seen[key]
                self.exclude.discard(key)
        return back

    def request_id(self, attempt: int) -> str:
        """The engine request id of one attempt: `{root}#a{attempt}`."""
        return f"{self.root}#a{attempt}"

    # ------------------------------------------------------------------ answers

    def send(self, status: int, body: bytes) -> None:
        """Answer the client with a whole response (the call is committed from here on)."""
        self.status = status
        self.committed = True
        self.conn.send(self.req, status, body, extra=[(b"x-request-id", self.root_b)])

    def send_error(self, status: int, message: str, code: str | None = None) -> None:
        """Answer an error of the coordinator's in the client's API."""
        self.send(
            status,
            anthropic_error(status, message) if self.anthropic else openai_error(status, message, code),
        )

    def relay_error(self, status: int, body: bytes) -> None:
        """Answer with an engine's error body, reshaped for an Anthropic client."""
        self.send(status, anthropic_from(status, body) if self.anthropic else body)

    def error_event(self, message: str) -> bytes:
        """The SSE event that ends this call's stream, already under way, with an upstream error."""
        return anthropic_sse_error(502, message) if self.anthropic else openai_sse_error(502, message)
