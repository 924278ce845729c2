"""The cluster config file (JSON or YAML): one model per section, strict about typos.

A bad file fails with a `ConfigError` naming the file, the field path and what was expected.
Parsing text is pure; reading the file is left to the caller (`load_config_text`).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from core.configbase import Strict, check_keys, one_of
from core.coordconfig import CoordinatorConfig
from core.errors import ConfigError
from core.events import Role
from core.redact import MASK, secret_name


class TLSConfig(Strict):
    """TLS files: `ca_file` verifies the server, `cert_file`/`key_file` are a client certificate;
    `server_cert_file`/`server_key_file` are the embedded server's (`motor up` makes a
    throwaway CA and certificate under `.motor/tls/` when TLS is required and these are unset)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_cert_file: str | None = None
    server_key_file: str | None = None

    @model_validator(mode="after")
    def _pairs(self) -> TLSConfig:
        if (self.server_cert_file is None) != (self.server_key_file is None):
            raise ValueError("server_cert_file and server_key_file go together")
        return self


MIN_MAX_AGE = 10.0  # seconds: the shortest MOTOR max_age a config may ask for


class NatsConfig(Strict):
    """Where NATS is and how to log in. Secrets belong in the environment or a context file
    (`MOTOR_NATS_CONTEXT`, `MOTOR_NATS_USER`/`MOTOR_NATS_PASSWORD` …, see streams/credentials.py)
    rather than in this file; `motor up` generates per-role credentials for its own server."""

    urls: list[str] = Field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    user: str | None = None
    password: str | None = None
    password_file: str | None = None  # first line of the file; env MOTOR_NATS_PASSWORD wins
    token: str | None = None
    token_file: str | None = None  # first line of the file; env MOTOR_NATS_TOKEN wins
    creds_file: str | None = None
    context_file: str | None = None  # a `nats` CLI context JSON: url, user, password, token, creds, ca …
    tls: TLSConfig | None = None
    # TLS before anything else on every connection (the server's `tls { handshake_first: true }`);
    # `motor up` then runs its server with TLS only, so plaintext clients are refused.
    require_tls: bool = False
    replicas: int = Field(1, ge=1, le=5)
    # How long MOTOR keeps events, in days; a fraction is a shorter log (1/1440: a minute),
    # down to MIN_MAX_AGE seconds. Long-lived facts are said again before they age out
    # (`core.ageout`), so a fold that starts from the log alone still sees every instance.
    max_age_days: float = Field(30, gt=0)
    # How many bytes MOTOR may hold; a publish beyond is refused ("maximum bytes exceeded"),
    # never an older event dropped for it. Unset: 1 GiB (`core.storelimits`), or what the disk
    # under the embedded server's store allows, which `motor up` writes into the config it runs.
    max_bytes: int | None = Field(None, ge=1024 * 1024)
    embedded: bool = True  # `motor up` starts its own nats-server unless --nats-url is given

    @field_validator("max_age_days")
    @classmethod
    def _max_age(cls, days: float) -> float:
        if days * 86400 < MIN_MAX_AGE:
            raise ValueError(
                f"must keep events at least {MIN_MAX_AGE:g} s ({MIN_MAX_AGE / 86400:.6f} days): "
                "facts are said again at half of it, and a restater needs the other half"
            )
        return days

    @model_validator(mode="after")
    def _check(self) -> NatsConfig:
        one_of(self, "password")
        one_of(self, "token")
        return self


class HealthCheckConfig(Strict):
    """Native `/health` probing (seed 002 `health_check_config`).

    `timeout` is one request's limit (the seed's `health_collector_timeout`, 5 s);
    `retry_attempts` the attempts of one check, the first included, spent only on timeouts
    (`health_collector_timeout_retry_attempts`): a refused connection or an HTTP error fails
    the check at once. Before the first success, failures keep the endpoint STARTING for
    `startup_timeout` (model loading).
    """

    startup_timeout: float = Field(1800.0, gt=0)
    interval: float = Field(1.0, gt=0)
    timeout: float = Field(5.0, gt=0)
    retry_attempts: int = Field(3, ge=1)


class FaultToleranceConfig(Strict):
    """The node agent's fault reporter (seed 002 NodeManager `fault_tolerance_config`).

    `enabled` None: on when the engine config enables fault tolerance
    (`engine_config.enable_fault_tolerance`), as the seed's NodeManager does.
    """

    enabled: bool | None = None
    poll_interval: float = Field(5.0, gt=0)
    poll_timeout: float = Field(5.0, gt=0)
    max_poll_failures: int = Field(3, ge=1)


DEFAULT_SNAPSHOT_METADATA = "/snapshot/snapshot_metadata.json"


class SnapshotConfig(Strict):
    """Container snapshot (vLLM only). The metadata file defaults to the seed's path;
    `metadata_dir` (older configs) puts `snapshot_metadata.json` in that directory instead."""

    enabled: bool = False
    metadata_path: str = DEFAULT_SNAPSHOT_METADATA
    metadata_dir: str | None = None
    checkpoint_marker: str = "checkpoint"
    model_save_path: str | None = None
    model_load_path: str | None = None
    namespace: str | None = None  # written to the metadata; a restored node re-resolves DNS with it

    def metadata_file(self) -> str:
        """Where the metadata file is: `<metadata_dir>/snapshot_metadata.json`, else `metadata_path`."""
        if self.metadata_dir is not None:
            return str(PurePath(self.metadata_dir) / "snapshot_metadata.json")
        return self.metadata_path


class EngineSection(Strict):
    """One of `union`, `prefill`, `decode`: how many instances and how each engine runs."""

    instances: int = Field(1, ge=0)
    engine_type: Literal["vllm", "sglang", "builtin"] = "builtin"
    model: str = "motor-sim"  # served model name
    model_path: str | None = None
    engine_config: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # The program that starts the engine, when not the default (`vllm`, `python3 -m
    # sglang.launch_server`): e.g. a separate venv's python with `-m vllm.entrypoints.cli.main`.
    launcher: list[str] | None = None
    dispatch_profile: Literal["handoff", "trigger", "bootstrap"] | None = None
    health_check_config: HealthCheckConfig = HealthCheckConfig()
    fault_tolerance: FaultToleranceConfig = FaultToleranceConfig()
    devices_per_node: int = Field(0, ge=0)  # without `--devices`, a node agent pins devices 0..n-1
    snapshot: SnapshotConfig = SnapshotConfig()

    def engine_value(self, key: str, default: Any = None) -> Any:
        """Read an engine option by its snake_case or kebab-case name."""
        if key in self.engine_config:
            return self.engine_config[key]
        return self.engine_config.get(key.replace("_", "-"), default)

    def nodes_per_instance(self) -> int:
        """How many nodes (pods) one instance spans: the engine's `nnodes`, default 1."""
        return int(self.engine_value("nnodes", 1) or 1)

    def dp_size(self) -> int:
        return int(self.engine_value("data_parallel_size", 1) or 1)

    def endpoints_per_node(self) -> int:
        """DP ranks served by one node: `data_parallel_size_local`, else dp / nnodes."""
        local = self.engine_value("data_parallel_size_local")
        if local:
            return int(local)
        return max(1, self.dp_size() // self.nodes_per_instance())

    def fault_reporter_on(self) -> bool:
        """Whether the node agent polls `/fault_tolerance/status`: explicit, else the engine's FT flag."""
        if self.fault_tolerance.enabled is not None:
            return self.fault_tolerance.enabled
        value = self.engine_value("enable_fault_tolerance")
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)

    def bootstrap_port(self) -> int | None:
        value = self.engine_value("disaggregation_bootstrap_port")
        return int(value) if value is not None else None

    @model_validator(mode="after")
    def _check(self) -> EngineSection:
        if self.snapshot.enabled and self.engine_type == "sglang":
            raise ValueError("snapshot.enabled is supported for vllm only, not sglang")
        nn, dp = self.nodes_per_instance(), self.dp_size()
        if nn < 1:
            raise ValueError("engine_config.nnodes must be >= 1")
        if dp > 1 and dp % nn and not self.engine_value("data_parallel_size_local"):
            raise ValueError(f"data_parallel_size {dp} is not divisible by nnodes {nn}")
        return self


class ControllerConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=1, le=65535)
    heartbeat_timeout: float = Field(10.0, gt=0)  # silent this long -> INACTIVE
    terminate_after: float = Field(60.0, gt=0)  # silent this long -> TERMINATED, nodes freed
    start_timeout: float = Field(30.0, gt=0)  # no READY within this -> resend start
    start_attempts: int = Field(3, ge=1)
    lease_ttl: float = Field(2.0, gt=0)  # a standby decides about this long after the leader died
    checkpoint_every: int = Field(1000, ge=1)
    scale_p2d: bool = False
    recovery_timeout: float = Field(300.0, gt=0)
    tick_interval: float = Field(0.5, gt=0)
    # An instance that crashes after READY is restarted at once; each further crash in a row
    # waits restart_backoff_initial, doubling up to restart_backoff_max. A crash after the
    # instance served (ACTIVE) for restart_reset_after starts the count again. The
    # restart_limit-th crash in a row fails the instance over (terminated, rebuilt on other
    # nodes); the node it crashed on sits out of assembly for failover_hold (or until it
    # registers again).
    restart_backoff_initial: float = Field(1.0, gt=0)
    restart_backoff_max: float = Field(60.0, gt=0)
    restart_reset_after: float = Field(300.0, gt=0)
    restart_limit: int = Field(5, ge=2)
    failover_hold: float = Field(300.0, gt=0)
    # How long a drain the controller starts (scale-down, a rolling restart's step) lets an
    # instance finish what it carries before its engines stop; `motor drain`'s default too.
    drain_timeout: float = Field(30.0, ge=0, le=86400)
    # Keys for the HTTP API (all but /liveness, /readiness and, if public, /metrics); none: open.
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str | None = None  # one key a line; env MOTOR_CONTROLLER_API_KEYS wins
    public_metrics: bool = True

    _keys = field_validator("api_keys")(check_keys)

    @model_validator(mode="after")
    def _check(self) -> ControllerConfig:
        one_of(self, "api_keys")
        return self


class NodeAgentConfig(Strict):
    host: str = "127.0.0.1"
    port_base: int = Field(8200, ge=1, le=65535)
    engine_port_base: int = Field(9000, ge=1, le=65535)
    heartbeat_interval: float = Field(1.0, gt=0)
    stop_grace: float = Field(10.0, gt=0)
    fault_reporter: bool = False  # on for every section, whatever its fault_tolerance says
    # Consecutive heartbeats with an ABNORMAL endpoint after which the node declares itself
    # failed (seed 002 HeartbeatManager: 5); 0 turns the rule off.
    suicide_threshold: int = Field(5, ge=0)
    log_dir: str = ".motor/logs"
    job_name: str = "motor"
    # A command whose handling raises is delivered again after command_retry_delay (doubling),
    # command_attempts deliveries in all; then it is refused (`handler_failed`).
    command_attempts: int = Field(3, ge=1)
    command_retry_delay: float = Field(1.0, gt=0)
    # On SIGTERM (a pod's PreStop, `motor up` stopping) a node agent whose engines serve first
    # drains them: out of routing at once, then at most this long to finish what they carry.
    drain_timeout: float = Field(30.0, ge=0, le=86400)
    # A drain calls an engine idle after it had no request running or waiting this long (a
    # request routed just before the coordinators folded the drain still lands).
    drain_settle: float = Field(1.0, ge=0, le=60)
    # A fleet operation's request to one engine (`motor fleet`, `motor lora`) gets at most this
    # long to answer (a weights reload or a wake from level-2 sleep is slow).
    engine_op_timeout: float = Field(120.0, gt=0, le=3600)


class ClusterConfig(Strict):
    name: str = "motor"
    nats: NatsConfig = NatsConfig()
    controller: ControllerConfig = ControllerConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    nodeagent: NodeAgentConfig = NodeAgentConfig()
    union: EngineSection | None = None
    prefill: EngineSection | None = None
    decode: EngineSection | None = None

    def section(self, role: Role | str) -> EngineSection | None:
        return {"union": self.union, "prefill": self.prefill, "decode": self.decode}[str(role)]

    def sections(self) -> dict[Role, EngineSection]:
        out: dict[Role, EngineSection] = {}
        for role in (Role.UNION, Role.PREFILL, Role.DECODE):
            sec = self.section(role)
            if sec is not None:
                out[role] = sec
        return out

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.union is None and self.prefill is None and self.decode is None:
            raise ValueError("at least one engine section (union, prefill or decode) is required")
        if (self.prefill is None) != (self.decode is None) and self.decode is not None:
            raise ValueError("a decode section needs a prefill section")
        return self


def config_from_dict(raw: dict[str, Any], source: str = "<config>") -> ClusterConfig:
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid config"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        expected = err["msg"]
        got = err.get("input")
        detail = f"  {path}: {expected}"
        if err["type"] not in ("missing",) and not isinstance(got, dict):
            secret = any(secret_name(str(p)) for p in err["loc"])
            detail += f" (got {MASK})" if secret else f" (got {got!r})"
        lines.append(detail)
    return "\n".join(lines)


def default_config() -> ClusterConfig:
    """The embedded default: one union instance and one 1P1D pair of builtin engines."""
    return ClusterConfig(
        union=EngineSection(instances=1, dispatch_profile=None),
        prefill=EngineSection(instances=1, dispatch_profile="handoff"),
        decode=EngineSection(instances=1, dispatch_profile="handoff"),
    )
