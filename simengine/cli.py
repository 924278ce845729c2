"""The builtin engine's command line: `python -m simengine --port P [--role ...] [--fast] ...`.

The node agent starts each builtin engine as its own process with this command line
(`nodeagent/backends/builtin.py`); `motor engine builtin ARGS` is the same parser under the
`motor` CLI. By hand: `python -m simengine --port 9000 --model motor-sim --fast`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from core.coordconfig import HttpLimitsConfig


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {value}")
    return value


HELP = "the builtin CPU engine: OpenAI API, vLLM/SGLang P/D, metrics, fault injection"
DESCRIPTION = (
    "A CPU simulator speaking vLLM's and SGLang's HTTP protocol. It is a test double and "
    "never a real model: its text is a deterministic function of the prompt and sampling params."
)


def build_parser(prog: str = "python -m simengine") -> argparse.ArgumentParser:
    """The engine's own parser."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def add_arguments(b: argparse.ArgumentParser) -> None:
    """Every flag of the engine, on `b` (the engine's own parser or `motor engine builtin`)."""
    b.add_argument("--port", type=_port, required=True, help="business port (OpenAI API, /health, /metrics)")
    b.add_argument("--host", default="127.0.0.1")
    b.add_argument("--role", choices=("union", "prefill", "decode"), default="union")
    b.add_argument("--model", default="motor-sim", help="served model name")
    b.add_argument("--served-model-name", action="append", default=[], help="another accepted model name")
    b.add_argument("--engine-id", default=None, help="engine id reported to P/D peers (default: random)")
    b.add_argument("--advertise-host", default=None, help="host P/D peers use to reach this engine")
    b.add_argument(
        "--bootstrap-port", type=_port, default=None, help="SGLang P/D bootstrap server port (prefill)"
    )
    b.add_argument("--fast", action="store_true", help="no simulated time at all (benchmarks)")
    g = b.add_argument_group("capacity and cache")
    g.add_argument("--num-blocks", type=_positive_int, default=4096, help="KV cache blocks")
    g.add_argument("--block-size", type=_positive_int, default=16, help="tokens per KV block")
    g.add_argument("--max-model-len", type=_positive_int, default=8192)
    g.add_argument("--max-num-seqs", type=_positive_int, default=256, help="requests running at once")
    g.add_argument("--kv-ttl", type=_non_negative_float, default=30.0, help="P/D: seconds a prefill keeps KV")
    g.add_argument(
        "--bootstrap-timeout", type=_non_negative_float, default=30.0, help="SGLang decode wait (s)"
    )
    g.add_argument(
        "--natural-min-tokens", type=_positive_int, default=64, help="earliest EOS without max_tokens"
    )
    g.add_argument(
        "--natural-max-tokens", type=_positive_int, default=256, help="latest EOS without max_tokens"
    )
    g.add_argument(
        "--kv-events-config",
        type=_json_object,
        default=None,
        help="publish KV cache events as vLLM does (JSON: enable_kv_cache_events, endpoint, replay_endpoint)",
    )
    sp = b.add_argument_group("speeds (ignored with --fast)")
    sp.add_argument("--ttft-base-ms", type=_non_negative_float, default=5.0)
    sp.add_argument("--prefill-tokens-per-s", type=float, default=20000.0)
    sp.add_argument("--itl-ms", type=_non_negative_float, default=8.0, help="inter-token time at batch 1")
    sp.add_argument(
        "--itl-per-running-ms", type=_non_negative_float, default=0.25, help="added per running request"
    )
    sp.add_argument("--kv-transfer-ms-per-block", type=_non_negative_float, default=0.02)
    f = b.add_argument_group("fault injection (also POST /admin/faults)")
    f.add_argument(
        "--crash-after", type=int, default=None, metavar="N", help="exit after answering N requests"
    )
    f.add_argument("--hang-health", action="store_true", help="/health never answers")
    f.add_argument("--error-rate", type=_rate, default=0.0, help="fraction of requests answered with 500")
    f.add_argument("--slow-tokens-ms", type=_non_negative_float, default=0.0, help="extra ms per token")
    f.add_argument(
        "--die-mid-stream", type=int, default=None, metavar="N", help="exit after streaming N tokens"
    )
    f.add_argument(
        "--end-stream-after",
        type=int,
        default=None,
        metavar="N",
        help="end streams cleanly after N tokens with no finish reason",
    )
    f.add_argument("--ft-status", choices=("healthy", "unhealthy", "dead"), default="healthy")
    f.add_argument("--precision-fault", action="store_true", help="emit NaN-like garbage text")
    h = b.add_argument_group("HTTP limits (defaults: coordinator.http's)")
    for name, field in HttpLimitsConfig.model_fields.items():
        kind = int if field.annotation is int else float
        h.add_argument(
            f"--{name.replace('_', '-')}", type=kind, default=None, help=f"default {field.default}"
        )
    b.add_argument("--log-level", default="INFO")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's) and serve; returns the exit code."""
    try:
        return run(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        return 130


def run(args: argparse.Namespace) -> int:
    """Serve one engine with the parsed flags; 2 with a message naming the flag if they clash."""
    # Imported here: `motor` builds this parser for every command, and only this one serves.
    from simengine.app import serve
    from simengine.options import EngineOptions, FaultSpec, Speeds

    if args.natural_max_tokens < args.natural_min_tokens:
        print("--natural-max-tokens must be >= --natural-min-tokens", file=sys.stderr)
        return 2
    if args.prefill_tokens_per_s <= 0:
        print("--prefill-tokens-per-s must be > 0", file=sys.stderr)
        return 2
    for name in ("crash_after", "die_mid_stream", "end_stream_after"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            print(f"--{name.replace('_', '-')} must be >= 0", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    extra: dict[str, Any] = {}
    if args.engine_id:
        extra["engine_id"] = args.engine_id
    given = {n: getattr(args, n) for n in HttpLimitsConfig.model_fields if getattr(args, n) is not None}
    try:
        extra["http"] = HttpLimitsConfig(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        print(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}", file=sys.stderr)
        return 2
    settings = EngineOptions(
        port=args.port,
        model=args.model,
        host=args.host,
        role=args.role,
        fast=args.fast,
        served_model_names=tuple(args.served_model_name),
        advertise_host=args.advertise_host,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        kv_ttl_s=args.kv_ttl,
        bootstrap_port=args.bootstrap_port,
        bootstrap_timeout_s=args.bootstrap_timeout,
        natural_min_tokens=args.natural_min_tokens,
        natural_max_tokens=args.natural_max_tokens,
        kv_events=args.kv_events_config,
        speeds=Speeds(
            ttft_base_ms=args.ttft_base_ms,
            prefill_tokens_per_s=args.prefill_tokens_per_s,
            itl_ms=args.itl_ms,
            itl_per_running_ms=args.itl_per_running_ms,
            kv_transfer_ms_per_block=args.kv_transfer_ms_per_block,
        ),
        faults=FaultSpec(
            crash_after=args.crash_after,
            hang_health=args.hang_health,
            error_rate=args.error_rate,
            slow_tokens_ms=args.slow_tokens_ms,
            die_mid_stream=args.die_mid_stream,
            end_stream_after=args.end_stream_after,
            ft_status=args.ft_status,
            precision=args.precision_fault,
        ),
        **extra,
    )
    return serve(settings)
