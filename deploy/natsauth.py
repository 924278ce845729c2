"""`motor up`'s NATS credentials: one user per role, written to `<root>/auth/` (0600).

The embedded server gets an `authorization` block with these users and the permissions of
`streams.permissions`; nobody logs in anonymously. Each child process gets the path of its
role's context file in `MOTOR_NATS_CONTEXT` (the password never appears on a command line).
The files are `nats` CLI contexts, so an operator can use them with the CLI too. Passwords are
kept across restarts of `motor up` (delete `<root>/auth/` to make new ones).

With `nats.require_tls` the server speaks TLS only, TLS first; its certificate is the
config's `nats.tls.server_cert_file`, else a throwaway CA and a certificate for 127.0.0.1
made here with `openssl` under `<root>/tls/`.

The CLI finds these files by itself (`discover`): `motor events`, `status` and `replay` log in
as `inspect`, `motor fault` and `motor precision` as `operator`, `motor events import` as
`admin` — when no credentials are given and the URL is the one the files were made for.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from core.config import NatsConfig
from streams.connection import NatsOptions, split_urls
from streams.credentials import (
    CONTEXT_ENV,
    CREDS_ENV,
    INBOX_ENV,
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    Credentials,
    CredentialsError,
    load_context,
    save_context,
)
from streams.permissions import NatsUser, cluster_users
from streams.server import authorization_conf, tls_conf

AUTH_DIR = "auth"
# An operator's NATS login in the environment: never handed to motor up's children.
OPERATOR_VARS = frozenset({USER_ENV, PASSWORD_ENV, TOKEN_ENV, CREDS_ENV, CONTEXT_ENV, INBOX_ENV})
TLS_DIR = "tls"
CERT_DAYS = 825


class AuthSetupError(Exception):
    """The credentials or certificates for the embedded server could not be made."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: str | None  # what clients verify the server with (None: the system's CAs)
    cert: str
    key: str


@dataclass
class ClusterAuth:
    """The users of one `motor up` cluster with their passwords, and where their files live."""

    root: Path
    users: list[tuple[NatsUser, str]]
    tls: TlsFiles | None = None

    @property
    def dir(self) -> Path:
        return self.root / AUTH_DIR

    def server_conf(self) -> str:
        """The blocks the embedded server's config needs: users and permissions, TLS."""
        parts = [authorization_conf(self.users)]
        if self.tls is not None:
            parts.append(tls_conf(self.tls.cert, self.tls.key, handshake_first=True))
        return "\n".join(parts)

    def context_path(self, user: str) -> Path:
        return self.dir / f"{user}.json"

    def credentials(self, user: str, url: str | None = None) -> Credentials:
        """The credentials of `user` (KeyError for a user this cluster does not have)."""
        for u, password in self.users:
            if u.name == user:
                return Credentials(
                    url=url,
                    user=u.name,
                    password=password,
                    inbox_prefix=u.inbox_prefix,
                    ca=self.tls.ca if self.tls else None,
                    tls_first=self.tls is not None,
                )
        raise KeyError(user)

    def write_contexts(self, url: str) -> None:
        """Write every user's context file (0600) naming the server's URL."""
        _private_dir(self.dir)
        for user, _ in self.users:
            save_context(
                self.context_path(user.name),
                self.credentials(user.name, url),
                f"motor up: {user.description}",
            )

    def options(self, user: str, url: str) -> NatsOptions:
        """Connection options of `user` for an in-process client (motor up itself, tests)."""
        return NatsOptions.from_credentials(self.credentials(user, url), split_urls(url))

    def child_env(self, env: dict[str, str], child: str) -> dict[str, str]:
        """The environment of a child process of the cluster: its role's context file, by name.

        An operator's own `MOTOR_NATS_USER` … would win over the file: they are left out.
        """
        user = user_for_child(child)
        if user is None:
            return env  # not a NATS client of ours: nothing to give it
        out = {k: v for k, v in env.items() if k not in OPERATOR_VARS}
        out[CONTEXT_ENV] = str(self.context_path(user))
        return out


def user_for_child(child: str) -> str | None:
    """The NATS user of a `motor up` child: `controller-c1` → controller, `nodeagent-<n>` itself."""
    for role in ("controller", "coordinator"):
        if child.startswith(role):
            return role
    if child.startswith("nodeagent-"):
        return child
    return None


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _old_password(path: Path, user: str) -> str | None:
    try:
        old = load_context(path)
    except CredentialsError:
        return None
    return old.password if old.user == user and old.password else None


def prepare(root: Path, node_ids: Iterable[str], nats: NatsConfig) -> ClusterAuth:
    """Users and passwords for a cluster with these nodes (kept from an earlier run when present)."""
    auth = ClusterAuth(root=root, users=[])
    _private_dir(auth.dir)
    for user in cluster_users(node_ids):
        password = _old_password(auth.context_path(user.name), user.name) or secrets.token_urlsafe(24)
        auth.users.append((user, password))
    if nats.require_tls:
        auth.tls = server_tls(root, nats)
    return auth


ROUTE_SECRET = "route.secret"


def route_password(root: Path) -> str:
    """The password the members of a NATS cluster route with (made once, kept under `auth/`)."""
    d = root / AUTH_DIR
    _private_dir(d)
    path = d / ROUTE_SECRET
    with contextlib.suppress(OSError):
        old = path.read_text().strip()
        if old:
            return old
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    return password


def server_tls(root: Path, nats: NatsConfig) -> TlsFiles:
    """The embedded server's certificate: the config's, else a local CA's (made once)."""
    tls = nats.tls
    if tls is not None and tls.server_cert_file and tls.server_key_file:
        return TlsFiles(tls.ca_file, tls.server_cert_file, tls.server_key_file)
    d = root / TLS_DIR
    files = TlsFiles(str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key"))
    if not all(Path(f).is_file() for f in (files.cert, files.key, files.ca or "")):
        make_local_certs(d)
    return files


def make_local_certs(d: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> None:
    """A throwaway CA and a server certificate for `hosts`, made with the `openssl` CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise AuthSetupError(
            "nats.require_tls: no nats.tls.server_cert_file given and no `openssl` to make one; "
            "install openssl or name a certificate in the config"
        )
    _private_dir(d)
    san = ",".join(f"IP:{h}" if h[:1].isdigit() else f"DNS:{h}" for h in hosts)
    (d / "ext.cnf").write_text(f"subjectAltName={san}\n")

    def run(*args: str) -> None:
        try:
            subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=120)
        except subprocess.CalledProcessError as exc:
            raise AuthSetupError(f"openssl {args[0]} failed: {exc.stderr.decode(errors='replace')}") from None

    days = str(CERT_DAYS)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", days, "-subj", "/CN=motor-up local CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", f"/CN={hosts[0]}")  # fmt: skip
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", days, "-extfile", "ext.cnf")  # fmt: skip
    for name in ("ca.key", "server.key"):
        os.chmod(d / name, 0o600)
    with contextlib.suppress(FileNotFoundError):
        (d / "server.csr").unlink()


# --------------------------------------------------------------------------- the CLI's side


def _same_server(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        rest = u.split("://", 1)[-1].rsplit("@", 1)[-1].rstrip("/")
        return rest.replace("localhost:", "127.0.0.1:")

    return norm(a) == norm(b)


def discover(root: Path, user: str, urls: list[str] | None) -> Credentials | None:
    """`motor up`'s credentials of `user` under `root`, if they were made for this server.

    `urls` None: no URL was given, so the file's URL is the one to use. Files made for
    another server are never sent to this one.
    """
    path = root / AUTH_DIR / f"{user}.json"
    if not path.is_file():
        return None
    creds = load_context(path)
    if urls and not any(_same_server(u, f) for u in urls for f in split_urls(creds.url or "")):
        return None
    return creds if urls is None else replace(creds, url=",".join(urls))
