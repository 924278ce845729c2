"""One admitted request, immutable: what the client asked, as the engines get it.

`Ask` is made once by `admit.py` and never changes (every field `Final`, checked by mypy);
what does change while a request is served lives apart, in `deliver.Delivery`. Request ids:
the coordinator always makes its own (`Ids`); the engines' request ids (`{root}#a{n}`) and
SGLang bootstrap rooms derive from it; a client's `x-request-id` is echoed back and logged,
never sent on, so two clients cannot collide on purpose.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Final

from coordinator.proxy.routes import ClientRoute
from http1.request import Request
from http1.server import ClientConn

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


class Ids:
    """Root request ids: a random per-process prefix and a counter (unique across replicas
    without a syscall per request)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        """A new root id."""
        return self._prefix + format(next(self._counter), "010x")


class Ask:
    """One admitted request. Immutable: a plain slotted class with `Final` fields rather than a
    frozen dataclass, whose `__init__` costs several times more on the hot path."""

    __slots__ = (
        "body",
        "client_id",
        "conn",
        "fold",
        "model",
        "raw",
        "req",
        "root",
        "root_b",
        "route",
        "stream",
        "t0",
    )

    def __init__(
        self,
        conn: ClientConn,
        req: Request,
        route: ClientRoute,
        body: dict[str, Any],
        raw: bytes,
        *,
        root: str,
        fold: bool = False,
    ) -> None:
        self.conn: Final = conn
        self.req: Final = req
        self.route: Final = route
        # What the first attempt sends, and what every continuation is built from: the client's
        # body without reserved fields (an Anthropic one translated; a folded whole answer's
        # asked as a stream), and its bytes (the client's own when untouched).
        self.body: Final = body
        self.raw: Final = raw
        model = body.get("model")
        self.model: Final = model if isinstance(model, str) else None
        self.stream: Final = body.get("stream") is True and not fold
        self.fold: Final = fold  # a whole answer asked of its engine as a stream (`wholefold.py`)
        self.root: Final = root
        client_id = client_request_id(req.headers)
        self.client_id: Final = client_id
        self.root_b: Final = (client_id or root).encode()  # what the response's x-request-id says
        self.t0: Final = time.perf_counter()

    @property
    def tag(self) -> str:
        """How log lines name this request: our id, and the client's when it sent one."""
        return self.root if self.client_id is None else f"{self.root} (x-request-id {self.client_id})"

    def request_id(self, attempt: int) -> str:
        """The engine request id of one attempt: `{root}#a{attempt}`."""
        return f"{self.root}#a{attempt}"
