"""Connecting to NATS: URL list, user/password, token, creds file, TLS; reconnect forever.

Credentials come from the config, a `nats` CLI context file or the environment
(`streams.credentials`); URLs are logged with their password masked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import ssl
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import NoServersError

from core.config import NatsConfig
from core.redact import redact_url
from streams.credentials import Credentials, resolve
from streams.errors import NatsUnavailable

log = logging.getLogger(__name__)

DEFAULT_URL = "nats://127.0.0.1:4222"
# nats-py waits a fixed time between reconnect rounds; the jitter spreads a fleet of agents
# so they do not all hit a restarted server in the same millisecond.
RECONNECT_WAIT = 1.0
# A server cut off the network sends no RST: the client learns it is gone only when its PINGs
# go unanswered. nats-py's default (a PING every 120 s, 2 outstanding) leaves a client on the
# wrong side of a partition for minutes, its heartbeats lost and its folds stalled while the
# other servers serve; this finds out within ~3 s and moves to a server it can reach.
PING_INTERVAL = 1.0
MAX_PINGS_OUT = 2

# The options each client was made with, so a bulk reader can open its own raw connection
# with the same credentials (streams.rawsub) without the caller passing them again.
_OPTIONS: weakref.WeakKeyDictionary[Client, NatsOptions] = weakref.WeakKeyDictionary()


def options_for(nc: Client) -> NatsOptions | None:
    """The options `connect` used for this client, or None for a client made elsewhere."""
    return _OPTIONS.get(nc)


@dataclass
class NatsOptions:
    """Where and how to connect; built from the config's `nats` section or from CLI flags."""

    urls: list[str] = field(default_factory=lambda: [DEFAULT_URL])
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    inbox_prefix: str | None = None  # replies and push deliveries: `_INBOX.<user>` under motor up
    # TLS before anything else is sent (the server's `tls { handshake_first: true }`): neither
    # the password nor the CONNECT line ever crosses the wire in clear.
    tls_first: bool = False

    @classmethod
    def from_config(
        cls, cfg: NatsConfig, urls: list[str] | None = None, env: Mapping[str, str] | None = None
    ) -> NatsOptions:
        """Options from a `NatsConfig`, a context file and the environment (`streams.credentials`).

        `urls` (e.g. from --nats-url) wins over the context file's `url`, which wins over the
        config's `nats.urls`.
        """
        tls = cfg.tls
        base = Credentials(
            user=cfg.user,
            password=cfg.password,
            token=cfg.token,
            creds=cfg.creds_file,
            ca=tls.ca_file if tls else None,
            cert=tls.cert_file if tls else None,
            key=tls.key_file if tls else None,
            tls_first=cfg.require_tls,
        )
        creds = resolve(base, cfg.context_file, os.environ if env is None else env)
        return cls.from_credentials(creds, urls or split_urls(creds.url or "") or list(cfg.urls))

    @classmethod
    def from_credentials(cls, creds: Credentials, urls: list[str]) -> NatsOptions:
        """Options for these URLs with these credentials."""
        return cls(
            urls=list(urls),
            user=creds.user,
            password=creds.password,
            token=creds.token,
            creds_file=creds.creds,
            tls_ca=creds.ca,
            tls_cert=creds.cert,
            tls_key=creds.key,
            inbox_prefix=creds.inbox_prefix,
            tls_first=creds.tls_first,
        )

    def tls_context(self) -> ssl.SSLContext | None:
        """An SSL context when any TLS file is given, TLS comes first, or a URL says `tls://`."""
        wants_tls = self.tls_first or any(u.startswith("tls://") for u in self.urls)
        if not (self.tls_ca or self.tls_cert or wants_tls):
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect` (auth and TLS only)."""
        kw: dict[str, Any] = {}
        if self.user is not None:
            kw["user"] = self.user
            kw["password"] = self.password or ""
        if self.token is not None:
            kw["token"] = self.token
        if self.creds_file is not None:
            if not os.path.isfile(self.creds_file):
                raise NatsUnavailable(f"NATS creds file {self.creds_file!r} does not exist")
            kw["user_credentials"] = self.creds_file
        ctx = self.tls_context()
        if ctx is not None:
            kw["tls"] = ctx
        if self.tls_first:
            kw["tls_handshake_first"] = True
        if self.inbox_prefix:
            kw["inbox_prefix"] = self.inbox_prefix
        return kw

    def shown_urls(self) -> str:
        """The URLs as logs and messages show them (no `user:password@`)."""
        return ", ".join(redact_url(u) for u in self.urls)


def split_urls(text: str) -> list[str]:
    """A comma-separated URL list as a list."""
    return [u.strip() for u in text.split(",") if u.strip()]


def _as_options(target: NatsOptions | str | list[str]) -> NatsOptions:
    if isinstance(target, NatsOptions):
        return target
    if isinstance(target, str):
        return NatsOptions(urls=split_urls(target))
    return NatsOptions(urls=list(target))


async def connect(
    target: NatsOptions | str | list[str],
    name: str,
    *,
    retry_initial: bool = False,
    connect_timeout: float = 2.0,
) -> Client:
    """Connect and keep reconnecting forever; `retry_initial` also retries the first connect.

    Without `retry_initial` an unreachable server raises `NatsUnavailable` at once (what a
    CLI wants); services pass `retry_initial=True` so they can start before NATS does.
    """
    opts = _as_options(target)
    kwargs = opts.connect_kwargs()
    urls = opts.shown_urls()
    connected = False
    errors: list[BaseException] = []

    async def on_disconnect() -> None:
        if not nc.is_closed:  # close() reports a disconnect too; that one is expected
            log.warning("%s: disconnected from NATS, reconnecting", name)

    async def on_reconnect() -> None:
        url = redact_url(nc.connected_url.geturl()) if nc.connected_url else "?"
        log.warning("%s: reconnected to NATS at %s", name, url)

    async def on_error(exc: Exception) -> None:
        if connected:
            log.warning("%s: NATS error: %s", name, exc or type(exc).__name__)
            return
        if not errors and retry_initial:
            log.warning("%s: NATS at %s unreachable (%s); retrying", name, urls, exc or type(exc).__name__)
        errors.append(exc)

    async def on_closed() -> None:
        log.info("%s: NATS connection closed", name)

    wait = RECONNECT_WAIT + random.random() * RECONNECT_WAIT
    nc = Client()
    try:
        await nc.connect(
            servers=opts.urls,
            name=name,
            allow_reconnect=True,
            # nats-py retries the first connect forever at -1; a CLI wants a quick answer.
            max_reconnect_attempts=-1 if retry_initial else 1,
            reconnect_time_wait=wait if retry_initial else 0.1,  # type: ignore[arg-type]
            connect_timeout=connect_timeout,  # type: ignore[arg-type]
            ping_interval=PING_INTERVAL,  # type: ignore[arg-type]
            max_outstanding_pings=MAX_PINGS_OUT,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            error_cb=on_error,
            closed_cb=on_closed,
            **kwargs,
        )
    except (NoServersError, OSError, TimeoutError, nats.errors.Error) as exc:
        # An auth rejection says what to fix; a reset seen on the retry after it does not.
        auth = [e for e in errors if "authoriz" in str(e).lower() or "authentic" in str(e).lower()]
        cause = auth[0] if auth else errors[-1] if errors else exc
        with contextlib.suppress(Exception):
            await nc.close()
        raise NatsUnavailable(f"cannot reach NATS at {urls}: {_describe(cause)}") from None
    connected = True
    # From now on the connection is a service's lifeline: reconnect forever.
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = wait
    _OPTIONS[nc] = opts
    return nc


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in text:
        return "connection refused"
    return text or type(exc).__name__
