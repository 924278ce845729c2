"""A listening port of the HTTP/1.1 server core (`http1.server`): the socket, its connections'
watchdog and the handler; and how it goes away — at once (`stop`), or drained (`drain`): it
stops accepting, every request under way is answered (its response says `connection: close`),
idle keep-alive connections are closed, and what is still busy after the timeout is cut."""

from __future__ import annotations

import asyncio
import socket
import time

from core.coordconfig import HttpLimitsConfig
from http1.conn import LimitedProtocol, Watchdog
from http1.server import ClientConn, ErrorBody, Handler, HeadCheck

DRAIN_POLL = 0.05  # seconds between looks at what a draining server still serves


class Server:
    """Owns the listening socket, its connections' watchdog (cap, timeouts) and the handler."""

    def __init__(
        self,
        handler: Handler,
        *,
        error_body: ErrorBody,
        max_body: int,
        limits: HttpLimitsConfig | None = None,
        fds_per_conn: int = 1,
        normalize_paths: bool = True,
        head_check: HeadCheck | None = None,
    ) -> None:
        self.handler = handler
        self.head_check = head_check  # see the module's docstring
        self.error_body = error_body
        self.max_body = max_body
        self.normalize_paths = normalize_paths  # `Request.path` normalised (see there)
        self.limits = limits or HttpLimitsConfig()
        self.fds_per_conn = fds_per_conn  # descriptors a client connection may hold (for the cap)
        self.watchdog: Watchdog | None = None
        self.server: asyncio.Server | None = None

    @property
    def conns(self) -> set[LimitedProtocol]:
        """The open client connections."""
        return self.watchdog.conns if self.watchdog is not None else set()

    async def start(
        self, host: str, port: int, *, sock: socket.socket | None = None, reuse_port: bool = False
    ) -> None:
        """Listen on host:port (port 0 picks a free one), or on an already bound socket;
        `reuse_port` shares the port with other processes (coordinator replicas)."""
        loop = asyncio.get_running_loop()
        watchdog = self.watchdog = Watchdog(self.limits, loop, fds_per_conn=self.fds_per_conn)
        handler, max_body, error_body, normalize, head_check = (
            self.handler,
            self.max_body,
            self.error_body,
            self.normalize_paths,
            self.head_check,
        )

        def factory() -> ClientConn:
            return ClientConn(
                handler,
                watchdog,
                max_body=max_body,
                error_body=error_body,
                normalize_paths=normalize,
                head_check=head_check,
            )

        if sock is not None:
            self.server = await loop.create_server(factory, sock=sock, backlog=2048)
        else:
            self.server = await loop.create_server(
                factory, host, port, backlog=2048, reuse_address=True, reuse_port=reuse_port or None
            )

    @property
    def port(self) -> int:
        """The port it listens on."""
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def drain(self, within: float) -> int:
        """Stop accepting, let every request under way finish (new requests on an open
        connection are still answered, then it closes), close idle connections, and after
        `within` seconds cut what is left. Returns how many connections were cut."""
        if self.server is not None:
            self.server.close()  # the kernel hands new connections to another replica, or refuses
        deadline = time.monotonic() + within
        while True:
            left = 0
            for c in list(self.conns):
                if not isinstance(c, ClientConn) or c.closed:
                    continue
                c.draining = True
                if c.busy():
                    left += 1
                else:
                    c.close()  # idle keep-alive: nothing of the client's is lost
            if not left or time.monotonic() >= deadline:
                break
            await asyncio.sleep(DRAIN_POLL)
        await self.stop()
        return left

    async def stop(self) -> None:
        """Stop listening and close every client connection."""
        if self.server is not None:
            self.server.close()
        if self.watchdog is not None:
            self.watchdog.close_all()
        if self.server is not None:
            await self.server.wait_closed()
