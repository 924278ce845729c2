"""Helpers shared by the CLI commands: config loading, NATS options from flags."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from core.config import ClusterConfig, default_config
from core.configfile import parse_config
from core.errors import ConfigError
from core.redact import redact_url
from core.secrets import resolve_secrets
from deploy.config_import import load_mindie_file, read_text
from streams.connection import NatsOptions, split_urls
from streams.credentials import (
    CONTEXT_ENV,
    CREDS_ENV,
    INBOX_ENV,
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    Credentials,
    load_context,
    merge,
)


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer within [lo, hi] (what the event it goes into may carry)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo}, {hi}]")
        return value

    return parse


def load_config_file(path: str | None, env: str | None = None) -> ClusterConfig:
    """Read and validate a cluster config; `None` gives the embedded default. Secrets are
    filled in from their files and the environment (`core.secrets`).

    A MindIE-Motor `user_config.json` is recognised and mapped (with its `env.json` when
    `env` is given); the fields it accepts but does not use are listed once on stderr.
    """
    return resolve_secrets(_load(path, env), os.environ, _read_secret)


def _load(path: str | None, env: str | None) -> ClusterConfig:
    if path is None:
        if env is not None:
            raise ConfigError(f"{env}: --env goes with a MindIE-Motor user_config.json (--config)")
        return default_config()
    mindie = load_mindie_file(path, env)
    if mindie is not None:
        cfg, imported = mindie
        for line in imported.unused_report():
            print(f"{path}: {line}", file=sys.stderr)
        return cfg
    return parse_config(read_text(path), str(Path(path)))


def _read_secret(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_ROOT = ".motor"


def add_nats_args(parser: argparse.ArgumentParser, login: str = "inspect") -> None:
    """The connection flags every command that talks to NATS takes.

    Secrets are best given in the environment or a context file (flags show in `ps`). With
    none given, `motor up`'s credentials of the user `login` under `--root` are used, if they
    were made for the server at `--nats-url` (deploy.natsauth.discover).
    """
    g = parser.add_argument_group("NATS connection")
    g.add_argument(
        "--nats-url",
        default=None,
        help="comma-separated server URLs (env MOTOR_NATS_URL; default: the URL of `motor up`'s "
        f"credentials under --root, else {DEFAULT_NATS_URL})",
    )
    g.add_argument("--nats-user", default=os.environ.get(USER_ENV) or None, help=f"env {USER_ENV}")
    g.add_argument(
        "--nats-password",
        default=os.environ.get(PASSWORD_ENV) or None,
        help=f"prefer env {PASSWORD_ENV} or --nats-context: flags show in `ps`",
    )
    g.add_argument("--nats-token", default=os.environ.get(TOKEN_ENV) or None, help=f"env {TOKEN_ENV}")
    g.add_argument(
        "--nats-creds", default=os.environ.get(CREDS_ENV) or None, help=f"NATS .creds file (env {CREDS_ENV})"
    )
    g.add_argument(
        "--nats-context",
        default=os.environ.get(CONTEXT_ENV) or None,
        help=f"a `nats` CLI context file: url, user, password, token, creds, TLS files (env {CONTEXT_ENV})",
    )
    g.add_argument("--nats-tls-ca", default=os.environ.get("MOTOR_NATS_TLS_CA"))
    g.add_argument("--nats-tls-cert", default=os.environ.get("MOTOR_NATS_TLS_CERT"))
    g.add_argument("--nats-tls-key", default=os.environ.get("MOTOR_NATS_TLS_KEY"))
    g.add_argument(
        "--root",
        default=os.environ.get("MOTOR_ROOT", DEFAULT_ROOT),
        help=f"`motor up`'s state dir, whose NATS credentials ({login}) are used when none are given "
        "(env MOTOR_ROOT; default %(default)s)",
    )
    parser.set_defaults(nats_login=login)


def nats_options(args: argparse.Namespace) -> NatsOptions:
    """NatsOptions from the flags `add_nats_args` defined; `args.nats_url` is set to the URL used."""
    from deploy.natsauth import discover

    urls = split_urls(args.nats_url or os.environ.get("MOTOR_NATS_URL", "")) or None
    given = Credentials(
        user=args.nats_user,
        password=args.nats_password,
        token=args.nats_token,
        creds=args.nats_creds,
        inbox_prefix=os.environ.get(INBOX_ENV) or None,
        ca=args.nats_tls_ca,
        cert=args.nats_tls_cert,
        key=args.nats_tls_key,
    )
    layers = [given]
    if args.nats_context:
        layers.append(load_context(args.nats_context))
    elif not given.logs_in:
        found = discover(Path(args.root), args.nats_login, urls)
        if found is not None:
            layers.append(found)
    creds = merge(*layers)
    urls = urls or split_urls(creds.url or "") or [DEFAULT_NATS_URL]
    args.nats_url = ",".join(urls)
    return NatsOptions.from_credentials(creds, urls)


def unreachable_hint(url: str | None, exc: BaseException | None = None) -> str:
    """What to tell a user whose command could not reach (or log in to) NATS."""
    shown = ",".join(redact_url(u.strip()) for u in (url or DEFAULT_NATS_URL).split(","))
    text = str(exc or "").lower()
    if "authorization" in text or "authentication" in text:
        return (
            f"NATS at {shown} refused the login: run this where `motor up` runs (its credentials are "
            f"found under --root, default {DEFAULT_ROOT}), or give credentials ({CONTEXT_ENV}=FILE, "
            f"{USER_ENV}/{PASSWORD_ENV}, {CREDS_ENV})"
        )
    return (
        f"cannot reach NATS at {shown}: start a local cluster with `motor up`, "
        "or point --nats-url (env MOTOR_NATS_URL) at your server"
    )
