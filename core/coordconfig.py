"""The coordinator's section of the cluster config: ports, keys, HTTP limits, retries and
timeouts, routing policy, rate limit, breaker, precision detector."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from core.configbase import Strict, check_keys, one_of


class RateLimitConfig(Strict):
    requests_per_second: float = Field(0, ge=0)  # 0 = unlimited
    burst: int = Field(0, ge=0)
    max_in_flight: int = Field(0, ge=0)


class BreakerConfig(Strict):
    failures: int = Field(3, ge=1)
    backoff_initial: float = Field(30.0, gt=0)
    backoff_max: float = Field(300.0, gt=0)


class HedgeConfig(Strict):
    """A request with no first byte after `factor` × its endpoint's recent time to first byte
    (at least `min_delay`, at most the first-token timeout) is sent on another path as well:
    the first to answer wins, the other is aborted. At most `max_fraction` of the requests in
    flight are hedges at once (at least one), so a slow fleet is not doubled in load."""

    enabled: bool = True
    factor: float = Field(4.0, ge=1.0)
    min_delay: float = Field(1.0, gt=0)
    max_fraction: float = Field(0.1, gt=0, le=1.0)


class DecisionsConfig(Strict):
    """Per-request routing records (`motor replay --request`): the last `ring` requests are
    kept in memory; those that failed, were retried, continued, hedged or took `slow_s` or
    more, and a `sample` fraction of the rest, are appended to MOTOR_REQ."""

    ring: int = Field(4096, ge=1, le=1_000_000)
    sample: float = Field(0.0, ge=0.0, le=1.0)
    slow_s: float = Field(10.0, gt=0)


class PolicyConfig(Strict):
    union: str = "least_load"
    prefill: str = "prefix_affinity"
    decode: str = "least_load"


class PrecisionDetectorConfig(Strict):
    enabled: bool = False
    sample_rate: float = Field(0.1, ge=0, le=1)


class HttpLimitsConfig(Strict):
    """Limits of an HTTP server we write (the coordinator's ports, the builtin engine's)."""

    max_request_line: int = Field(8 * 1024, ge=256)  # 414 beyond
    max_header_bytes: int = Field(64 * 1024, ge=1024)  # 431 beyond
    max_header_fields: int = Field(100, ge=8)  # 431 beyond
    header_timeout: float = Field(10.0, gt=0)  # a request head must arrive within this (408)
    # A whole body must arrive within this from the end of its head (408); bytes trickled do
    # not extend it (they reset only the idle timer).
    body_timeout: float = Field(30.0, gt=0)
    idle_timeout: float = Field(60.0, gt=0)  # keep-alive: closed after this long without a request
    # A client that takes none of its response for this long (its socket full) is cut: a
    # proxied request holds an engine slot while its reader does not read.
    write_stall_timeout: float = Field(30.0, gt=0)
    max_connections: int = Field(4096, ge=1)  # 503 beyond


class CoordinatorConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # The management API's own port (seed 001's manage port); None: served on `port`.
    mgmt_port: int | None = Field(None, ge=1, le=65535)
    # User keys for /v1 (any route but the probes); none: /v1 is open.
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str | None = None  # one key a line; env MOTOR_COORDINATOR_API_KEYS wins
    # Keys for the management API (refresh, precision, instance views). While any key is
    # configured, management needs one of these: a user key is not enough.
    admin_keys: list[str] = Field(default_factory=list)
    admin_keys_file: str | None = None  # env MOTOR_COORDINATOR_ADMIN_KEYS wins
    public_metrics: bool = True  # False: /metrics needs an admin key
    http: HttpLimitsConfig = HttpLimitsConfig()
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    retries: int = Field(2, ge=0)
    first_token_timeout: float = Field(60.0, gt=0)  # no first byte within this -> retried elsewhere
    inter_token_timeout: float = Field(30.0, gt=0)  # a stream silent this long -> continued elsewhere
    # A whole (non-streamed) answer whose token budget is unset or at least this many tokens is
    # asked of its engine as a stream and folded into one body, so an engine dying midway costs
    # a continuation, not a whole generation again; shorter ones keep the plain (cheaper) whole
    # path and are generated again. None: every whole answer takes the plain path.
    continue_whole_from_tokens: int | None = Field(32, ge=1)
    request_timeout: float = Field(600.0, gt=0)
    # On SIGTERM a replica stops accepting, says not-ready and answers what it carries for at
    # most this long before it cuts the rest (0: it stops at once).
    drain_timeout: float = Field(30.0, ge=0)
    policy: PolicyConfig = PolicyConfig()
    rate_limit: RateLimitConfig = RateLimitConfig()
    breaker: BreakerConfig = BreakerConfig()
    hedge: HedgeConfig = HedgeConfig()
    decisions: DecisionsConfig = DecisionsConfig()
    precision_detector: PrecisionDetectorConfig = PrecisionDetectorConfig()
    # Seconds between scrapes of every engine's /metrics, re-exposed relabelled on /metrics
    # (seed 002's coordinator metrics collector; MindIE `prometheus_metrics_config.reuse_time`).
    engine_metrics_interval: float = Field(3.0, gt=0)

    _keys = field_validator("api_keys", "admin_keys")(check_keys)

    @model_validator(mode="after")
    def _check(self) -> CoordinatorConfig:
        one_of(self, "api_keys")
        one_of(self, "admin_keys")
        return self
