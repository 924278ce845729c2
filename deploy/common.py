"""Helpers shared by the CLI commands: config loading, NATS options from flags."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core.config import ClusterConfig, default_config, parse_config
from core.errors import ConfigError
from core.redact import redact_url
from core.secrets import resolve_secrets
from streams.connection import NatsOptions


def read_text(path: str, what: str = "config") -> bytes:
    """A file's bytes, or a ConfigError naming it."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None


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
    from deploy.config_import import load_mindie_file

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


def add_nats_args(parser: argparse.ArgumentParser) -> None:
    """The connection flags every command that talks to NATS takes."""
    g = parser.add_argument_group("NATS connection")
    g.add_argument(
        "--nats-url",
        default=os.environ.get("MOTOR_NATS_URL", DEFAULT_NATS_URL),
        help="comma-separated server URLs (env MOTOR_NATS_URL; default %(default)s)",
    )
    g.add_argument("--nats-user", default=os.environ.get("MOTOR_NATS_USER"))
    # Secrets on a command line are visible to every user through `ps`: prefer the env.
    g.add_argument(
        "--nats-password",
        default=os.environ.get("MOTOR_NATS_PASSWORD"),
        help="prefer env MOTOR_NATS_PASSWORD",
    )
    g.add_argument(
        "--nats-token", default=os.environ.get("MOTOR_NATS_TOKEN"), help="prefer env MOTOR_NATS_TOKEN"
    )
    g.add_argument("--nats-creds", default=os.environ.get("MOTOR_NATS_CREDS"), help="NATS .creds file")
    g.add_argument("--nats-tls-ca", default=os.environ.get("MOTOR_NATS_TLS_CA"))
    g.add_argument("--nats-tls-cert", default=os.environ.get("MOTOR_NATS_TLS_CERT"))
    g.add_argument("--nats-tls-key", default=os.environ.get("MOTOR_NATS_TLS_KEY"))


def nats_options(args: argparse.Namespace) -> NatsOptions:
    """NatsOptions from the flags `add_nats_args` defined."""
    return NatsOptions(
        urls=[u.strip() for u in args.nats_url.split(",") if u.strip()],
        user=args.nats_user,
        password=args.nats_password,
        token=args.nats_token,
        creds_file=args.nats_creds,
        tls_ca=args.nats_tls_ca,
        tls_cert=args.nats_tls_cert,
        tls_key=args.nats_tls_key,
    )


def unreachable_hint(url: str) -> str:
    """What to do when NATS at `url` (comma-separated URLs) does not answer; passwords masked."""
    shown = ",".join(redact_url(u.strip()) for u in url.split(","))
    return (
        f"cannot reach NATS at {shown}: start a local cluster with `motor up`, "
        "or point --nats-url (env MOTOR_NATS_URL) at your server"
    )
