"""Helpers shared by the CLI commands: config loading, NATS options from flags."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from core.config import ClusterConfig, default_config, parse_config
from core.errors import ConfigError
from streams.connection import NatsOptions


def load_config_file(path: str | None) -> ClusterConfig:
    """Read and validate a cluster config; `None` gives the embedded default."""
    if path is None:
        return default_config()
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    return parse_config(text, str(p))


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
    g.add_argument("--nats-password", default=os.environ.get("MOTOR_NATS_PASSWORD"))
    g.add_argument("--nats-token", default=os.environ.get("MOTOR_NATS_TOKEN"))
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
    return (
        f"cannot reach NATS at {url}: start a local cluster with `motor up`, "
        "or point --nats-url (env MOTOR_NATS_URL) at your server"
    )
