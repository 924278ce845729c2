"""The management port (seed 001: `POST /v1/instances/refresh` goes to `manage_port`).

With `coordinator.mgmt_port` set, the management app is served on its own listener too,
so a controller or an operator tool reaches probes, metrics, refresh and alarm clearing
there, apart from the client traffic on `coordinator.port`. The `/v1` generation routes are
not on it; the management app checks admin keys itself (`coordinator.mgmt`), and the server
core checks the same keys on each request's head first (`mgmt_head`).

A replica also serves the management app on a private Unix socket (`--probe-socket`) when
its supervisor asks: replicas share their ports, so only there does a probe of `/liveness`
(or a scrape of `/metrics`) reach this one replica (`deploy.liveness`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Callable

from coordinator.proxy.asgi import ASGIApp, serve_asgi
from coordinator.proxy.server import ProxyServer
from core.coordconfig import HttpLimitsConfig
from http1.auth import Access, Denial, Guard, Pass
from http1.request import Request
from http1.server import ClientConn, HeadCheck


class MgmtOnly:
    """The request handler of the management port: every path goes to the management app."""

    def __init__(self, mgmt_app: ASGIApp) -> None:
        self.mgmt = mgmt_app

    async def __call__(self, conn: ClientConn, req: Request) -> None:
        await serve_asgi(self.mgmt, conn, req)


def mgmt_head(guard: Guard, access: Callable[[str], Access]) -> HeadCheck:
    """The management port's head check: what each path needs, asked of the app's `Guard`."""

    def head(path: bytes, headers: dict[bytes, bytes]) -> Denial | Pass:
        return guard.judge(access(path.decode("latin-1")), headers.get)

    return head


async def start_mgmt_server(
    mgmt_app: ASGIApp,
    host: str,
    port: int,
    *,
    max_body: int,
    limits: HttpLimitsConfig | None = None,
    reuse_port: bool = False,
    head_check: HeadCheck | None = None,
) -> ProxyServer:
    """Listen on the management port (within the HTTP `limits`; shared by replicas with
    `reuse_port`; keys checked on the head with `head_check`); the caller stops the server."""
    server = ProxyServer(MgmtOnly(mgmt_app), max_body=max_body, limits=limits, head_check=head_check)
    await server.start(host, port, reuse_port=reuse_port)
    return server


async def start_mgmt_unix(
    mgmt_app: ASGIApp, path: str, *, max_body: int, limits: HttpLimitsConfig | None = None
) -> ProxyServer:
    """Serve the management app on the Unix socket `path`, readable by this user only.

    A socket left by a killed predecessor is replaced (a killed process cannot remove it);
    any other file there is refused rather than deleted.
    """
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"probe socket {path}: a file that is not a socket is in the way")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.setblocking(False)
        server = ProxyServer(MgmtOnly(mgmt_app), max_body=max_body, limits=limits)
        await server.start("", 0, sock=sock)
    except BaseException:
        sock.close()
        raise
    return server
