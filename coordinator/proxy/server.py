"""The coordinator's listeners: the shared server core (`http1.server`) with the coordinator's
error bodies (Anthropic-shaped on the Anthropic routes, OpenAI-shaped elsewhere, even for a
refusal before the request was read). A client connection may hold an engine connection too,
so each counts as two descriptors against the connection cap.

`ClientConn` and `Request` are `http1.server`'s: handlers (`app.py`, the pipeline it hands
routed requests to, `asgi.py`) write to the connection; a client that goes away cancels its
request's task, which closes the engine connections it uses (an engine stops generating when
its client disconnects).
"""

from __future__ import annotations

from coordinator.errors import error_for_path
from core.coordconfig import HttpLimitsConfig
from http1.listen import Server
from http1.server import Handler, HeadCheck


class ProxyServer(Server):
    """A coordinator port: `handler` serves every request on it, `head_check` checks keys on
    each head first (`http1.server`)."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int,
        limits: HttpLimitsConfig | None = None,
        head_check: HeadCheck | None = None,
    ) -> None:
        super().__init__(
            handler,
            error_body=error_for_path,
            max_body=max_body,
            limits=limits,
            fds_per_conn=2,
            head_check=head_check,
        )
