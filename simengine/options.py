"""Options of one builtin engine process: identity, capacity, speeds and injected faults.

Everything here comes from the command line (`cli.py`); the server reads
it once at start. Faults can change later through `POST /admin/faults` (see `injection.py`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from core.coordconfig import HttpLimitsConfig

Role = Literal["union", "prefill", "decode"]
FtStatus = Literal["healthy", "unhealthy", "dead"]

ROLES: tuple[str, ...] = ("union", "prefill", "decode")
FT_STATUSES: tuple[str, ...] = ("healthy", "unhealthy", "dead")


@dataclass(frozen=True, slots=True)
class Speeds:
    """The timing model; ignored when `EngineOptions.fast` is set."""

    ttft_base_ms: float = 5.0  # fixed cost of a prefill step
    prefill_tokens_per_s: float = 20000.0  # uncached prompt tokens computed per second
    itl_ms: float = 8.0  # inter-token time with one running request
    itl_per_running_ms: float = 0.25  # added per other running request (batch slows steps)
    kv_transfer_ms_per_block: float = 0.02  # P/D: decode side loading remote KV


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Faults to inject, as given on the command line or to `POST /admin/faults`."""

    crash_after: int | None = None  # the process exits once this many requests were answered
    hang_health: bool = False  # /health never answers
    hang_health_count: int = 0  # the next N /health requests never answer (then it recovers)
    health_status: int | None = None  # /health answers with this HTTP status
    error_rate: float = 0.0  # fraction of /v1 generation requests answered with HTTP 500
    slow_tokens_ms: float = 0.0  # added to every inter-token gap (also in --fast mode)
    die_mid_stream: int | None = None  # the process exits after streaming this many tokens
    # A stream ends cleanly (usage, [DONE]) after this many tokens with no finish reason, as an
    # engine that dropped a request mid-generation without saying so
    end_stream_after: int | None = None
    ft_status: FtStatus = "healthy"  # what /fault_tolerance/status reports
    precision: bool = False  # NaN-like garbage instead of words


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Everything one builtin engine process needs to know."""

    port: int
    model: str = "motor-sim"
    host: str = "127.0.0.1"
    role: Role = "union"
    fast: bool = False
    served_model_names: tuple[str, ...] = ()
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    advertise_host: str | None = None  # what P/D peers use to reach us; default: host
    num_blocks: int = 4096
    block_size: int = 16
    max_model_len: int = 8192
    max_num_seqs: int = 256
    kv_ttl_s: float = 30.0  # P/D: how long a prefill keeps KV nobody fetched
    bootstrap_port: int | None = None  # SGLang P/D: the prefill engine's bootstrap server
    bootstrap_timeout_s: float = 30.0  # SGLang P/D: how long decode waits for its room
    natural_min_tokens: int = 64  # without max_tokens, text ends (EOS) after this many ...
    natural_max_tokens: int = 256  # ... to this many tokens, chosen by the prompt
    embedding_dim: int = 64
    speeds: Speeds = Speeds()
    faults: FaultSpec = FaultSpec()
    http: HttpLimitsConfig = field(default_factory=HttpLimitsConfig)  # head limits, timeouts, cap
    kv_events: dict[str, Any] | None = None  # vLLM's --kv-events-config (simengine.kvpublish)

    @property
    def public_host(self) -> str:
        """The host P/D peers are told to call back on."""
        if self.advertise_host:
            return self.advertise_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a request may use for the served model."""
        return (self.model, *[n for n in self.served_model_names if n != self.model])
