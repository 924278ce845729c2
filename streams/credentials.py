"""NATS credentials from a file or the environment, never only from flags (flags show in `ps`).

The file is a `nats` CLI context (JSON: `url`, `user`, `password`, `token`, `creds`, `ca`,
`cert`, `key`, `inbox_prefix`, `tls_first`), so the same file serves Motor and the `nats`
CLI; `motor up` writes one per role into `.motor/auth/` (mode 0600).

Where credentials come from, strongest first (the first that names a way to log in wins, so
a password from the environment never travels with a token from a file):

1. `MOTOR_NATS_USER` + `MOTOR_NATS_PASSWORD`, `MOTOR_NATS_TOKEN`, `MOTOR_NATS_CREDS` (a NATS
   `.creds` file);
2. the context file named by `MOTOR_NATS_CONTEXT`, else by the config's `nats.context_file`;
3. the config's `nats.user`/`password`/`token`/`creds_file`.

Replies and push deliveries go to the login's inbox prefix: the context file's
`inbox_prefix`, else `MOTOR_NATS_INBOX_PREFIX` with a login from the environment, else, for
a user login, `_INBOX.<user>`: the only inbox Motor's NATS permissions let a user subscribe to
(streams/permissions.py), so a user given as `MOTOR_NATS_USER` (or in the config) gets its
replies. Token and `.creds` logins keep nats-py's `_INBOX` unless a prefix is given.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from core.errors import SubjectError
from streams.errors import StreamsError
from streams.permissions import inbox_prefix as user_inbox

CONTEXT_ENV = "MOTOR_NATS_CONTEXT"
USER_ENV = "MOTOR_NATS_USER"
PASSWORD_ENV = "MOTOR_NATS_PASSWORD"
TOKEN_ENV = "MOTOR_NATS_TOKEN"
CREDS_ENV = "MOTOR_NATS_CREDS"
INBOX_ENV = "MOTOR_NATS_INBOX_PREFIX"


class CredentialsError(StreamsError):
    """A credentials file that cannot be read or makes no sense (named in the message)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """How to log in (one of user/password, token, creds file) and the TLS files and inbox to use."""

    url: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    inbox_prefix: str | None = None
    tls_first: bool = False

    @property
    def logs_in(self) -> bool:
        """Whether these name a way to log in (user, token or creds file)."""
        return bool(self.user or self.token or self.creds)

    def to_context(self, description: str = "") -> dict[str, Any]:
        """The `nats` CLI context form (empty strings for what is unset, as the CLI writes it)."""
        out: dict[str, Any] = {"description": description}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value if isinstance(value, bool) else (value or "")
        return out


_KEYS = {f.name for f in fields(Credentials)}


def load_context(path: str | Path) -> Credentials:
    """Read a `nats` CLI context file; unknown keys (the CLI's `nsc`, `color_scheme` …) are ignored."""
    p = Path(path)
    try:
        raw = orjson.loads(p.read_bytes())
    except OSError as exc:
        raise CredentialsError(f"NATS context file {p}: cannot read it: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise CredentialsError(f"NATS context file {p}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CredentialsError(f"NATS context file {p}: expected a JSON object")
    values: dict[str, Any] = {}
    for key in _KEYS:
        value = raw.get(key)
        if key == "tls_first":
            values[key] = bool(value)
        elif value not in (None, ""):
            if not isinstance(value, str):
                raise CredentialsError(f"NATS context file {p}: {key!r} must be a string")
            values[key] = value
    creds = Credentials(**values)
    if creds.password and not creds.user:
        raise CredentialsError(f"NATS context file {p}: a password without a user")
    return creds


def save_context(path: str | Path, creds: Credentials, description: str = "") -> None:
    """Write a context file readable by its owner only (0600), atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(orjson.dumps(creds.to_context(description), option=orjson.OPT_INDENT_2))
    os.replace(tmp, p)


def from_env(env: Mapping[str, str]) -> Credentials:
    """What the `MOTOR_NATS_*` variables say (the context file is read by `resolve`)."""
    return Credentials(
        user=env.get(USER_ENV) or None,
        password=env.get(PASSWORD_ENV) or None,
        token=env.get(TOKEN_ENV) or None,
        creds=env.get(CREDS_ENV) or None,
        inbox_prefix=env.get(INBOX_ENV) or None,
    )


def default_inbox(user: str | None) -> str | None:
    """`_INBOX.<user>`, the inbox Motor's permissions give a user; None without a user or for a
    name that is not one subject token (no permissions of ours name such a user)."""
    if not user:
        return None
    try:
        return user_inbox(user)
    except SubjectError:
        return None


def merge(*layers: Credentials) -> Credentials:
    """Strongest layer first: the first that logs in gives the login (and its inbox: the one it
    names, else a user's `_INBOX.<user>`); the URL and TLS files fill in field by field."""
    login = next((c for c in layers if c.logs_in), Credentials())

    def first(key: str) -> str | None:
        return next((getattr(c, key) for c in layers if getattr(c, key)), None)

    return Credentials(
        url=first("url"),
        user=login.user,
        password=login.password,
        token=login.token,
        creds=login.creds,
        ca=first("ca"),
        cert=first("cert"),
        key=first("key"),
        # the inbox the login's permissions allow
        inbox_prefix=login.inbox_prefix or default_inbox(login.user),
        tls_first=any(c.tls_first for c in layers),
    )


def resolve(config: Credentials, context_file: str | None, env: Mapping[str, str]) -> Credentials:
    """The credentials to use: environment, then the context file, then the config."""
    path = env.get(CONTEXT_ENV) or context_file
    from_file = load_context(path) if path else Credentials()
    return merge(from_env(env), from_file, config)
