"""API keys: who may call which route, decided on the path a router will see.

Routes are `PUBLIC` (the probes, and `/metrics` where configured), `USER` or `ADMIN`. While
any key is configured, a USER route takes a user or an admin key, an ADMIN route only an
admin key; with no key at all everything is open (a local cluster). Keys are read from
`Authorization: Bearer <key>` (scheme in any case) or `x-api-key` (the Anthropic SDK's) and
compared in constant time with every configured key.

The path is classified after percent-decoding and removing dot segments and empty segments
(`normalize_path`), and a server must route on that same path: a check on one spelling and
a route on another is how `/v1%2Finstances/refresh` walked past the old check.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import unquote

PROBES = frozenset({"/liveness", "/readiness", "/startup", "/health"})
METRICS = "/metrics"


class Access(Enum):
    """What a route needs."""

    PUBLIC = "public"
    USER = "user"
    ADMIN = "admin"


class Pass(Enum):
    """Why a request may go on: what the server core trusts a connection by (`http1.conn`)."""

    KEYED = "keyed"  # it carries a key this route takes
    OPEN = "open"  # no key is configured for this route: every client is equal
    ANONYMOUS = "anonymous"  # a public route (a probe, /metrics) reached without a valid key


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request is refused: 401 (no valid key) or 403 (a user key on an admin route)."""

    status: int
    message: str
    code: str


def normalize_path(path: str) -> str:
    """The path percent-decoded once, without `.`/`..` or empty segments (`/a//./b/` -> `/a/b`)."""
    if "%" in path:
        path = unquote(path, errors="replace")
    segments: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    return "/" + "/".join(segments)


class KeySet:
    """Configured keys, compared in constant time."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(k.encode() for k in keys if k)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def matches(self, key: bytes) -> bool:
        """Whether `key` is one of ours (every key is compared, whatever matches)."""
        found = False
        for k in self._keys:
            found |= hmac.compare_digest(k, key)
        return found


def presented_keys(get: Callable[[bytes], bytes | None]) -> list[bytes]:
    """The keys a request carries, from `Authorization: Bearer` and `x-api-key`."""
    out = []
    auth = get(b"authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(b" ")
        token = token.strip()
        if scheme.lower() == b"bearer" and token:
            out.append(token)
    api_key = get(b"x-api-key")
    if api_key is not None and api_key.strip():
        out.append(api_key.strip())
    return out


class Guard:
    """The key check of one server: user keys, admin keys, and where admin keys are configured."""

    def __init__(
        self,
        user_keys: Iterable[str] = (),
        admin_keys: Iterable[str] = (),
        *,
        admin_field: str = "admin_keys",
        public_metrics: bool = True,
    ) -> None:
        self.user = KeySet(user_keys)
        self.admin = KeySet(admin_keys)
        self.admin_field = admin_field
        self.public = PROBES | {METRICS} if public_metrics else PROBES

    @property
    def enabled(self) -> bool:
        """Whether any key is configured (else every route is open)."""
        return bool(self.user) or bool(self.admin)

    def check(self, access: Access, get: Callable[[bytes], bytes | None]) -> Denial | None:
        """None when a request with these headers may use a route of this access."""
        verdict = self.judge(access, get)
        return verdict if isinstance(verdict, Denial) else None

    def judge(self, access: Access, get: Callable[[bytes], bytes | None]) -> Denial | Pass:
        """The one key check: a `Denial`, or how the request passes (the server core trusts a
        connection by it on the request head, before any body byte; handlers use `check`)."""
        if not self.enabled:
            return Pass.OPEN
        if access is Access.USER and not self.user:
            return Pass.OPEN  # only management is locked
        keys = presented_keys(get)
        if any(self.admin.matches(k) for k in keys):
            return Pass.KEYED
        is_user = any(self.user.matches(k) for k in keys)
        if access is Access.PUBLIC:
            return Pass.KEYED if is_user else Pass.ANONYMOUS
        if access is Access.USER and is_user:
            return Pass.KEYED
        if is_user:
            why = f" (and {self.admin_field} is empty)" if not self.admin else ""
            return Denial(
                403, f"this route needs an admin key from {self.admin_field}{why}", "admin_key_required"
            )
        return Denial(401, "missing or wrong API key", "invalid_api_key")


AUTHENTICATE = (b"www-authenticate", b'Bearer realm="motor"')


class GuardMiddleware:
    """Pure ASGI middleware: every non-public route of the app needs a key (`access` per path).

    The app must route on the path this checks: the middleware hands the normalised path on.
    """

    def __init__(
        self,
        app: Any,
        guard: Guard,
        error_body: Callable[[int, str, str], bytes],
        access: Callable[[str], Access],
    ) -> None:
        self.app = app
        self.guard = guard
        self.error_body = error_body
        self.access = access

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = normalize_path(scope["path"])
        headers: Mapping[bytes, bytes] = {bytes(n).lower(): bytes(v) for n, v in scope.get("headers", ())}
        denial = self.guard.check(self.access(path), headers.get)
        if denial is None:
            await self.app({**scope, "path": path}, receive, send)
            return
        body = self.error_body(denial.status, denial.message, denial.code)
        out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if denial.status == 401:
            out.append(AUTHENTICATE)
        await send({"type": "http.response.start", "status": denial.status, "headers": out})
        await send({"type": "http.response.body", "body": body})
