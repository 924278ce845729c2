"""`POST /v1/instances/refresh` (seed 001): every rule of the body, each a 400 naming the field.

A valid body becomes `InstancesRefreshedData` (appended as `instances.refreshed`), so engines
run outside Motor are routed — and replayed — like managed ones. Motor's `event` verb is
accepted: `set` (default) replaces every external instance, `add` adds or updates, `del`
removes the `ids` (its `instances` may be empty).

Beyond the seed, an instance may say how to reach it for P/D: `engine_type` (vllm, sglang,
builtin), `capabilities` (e.g. ["handoff"]), `bootstrap_port` (SGLang) and Motor's
`endpoints` list (one routable endpoint each: `{id, ip?, business_port, mgmt_port?,
bootstrap_port?}`). Ports are strings in the seed; integers are accepted too and stored as
strings.
"""

from __future__ import annotations

from typing import Any

from coordinator.errors import CoordinatorError
from core.events import InstancesRefreshedData

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
ROLE_PREFILL, ROLE_DECODE, ROLE_UNDEF = 80, 68, 85
LABEL_PREFILL, LABEL_DECODE = 2, 3
ENGINE_TYPES = ("vllm", "sglang", "builtin")
EVENTS = ("add", "del", "set")
MAX_INSTANCES = 10000


class RefreshError(CoordinatorError):
    """A refresh body that breaks a rule; the message starts with the field's path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(400, f"{field}: {message}", code="invalid_field")
        self.field = field


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RefreshError(field, f"is required and must be an object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _uint(value: Any, field: str, lo: int = 0, hi: int = UINT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RefreshError(field, f"is required and must be an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise RefreshError(field, f"must be in [{lo}, {hi}], got {value}")
    return value


def _port(value: Any, field: str) -> str:
    """Seed 001 ports are strings in ["1024", "65535"]; an integer is accepted too."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise RefreshError(field, f'is required and must be a port string such as "8080", got {value!r}')
    if not 1024 <= number <= 65535:
        raise RefreshError(field, f'must be in ["1024", "65535"], got {value!r}')
    return str(number)


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RefreshError(field, f"is required and must be a non-empty string, got {value!r}")
    if any(c.isspace() for c in value):
        raise RefreshError(field, f"must not contain whitespace, got {value!r}")
    return value


def _id_list(value: Any, field: str) -> list[int]:
    if not isinstance(value, list):
        raise RefreshError(field, f"is required and must be a list of ids, got {_kind(value)}")
    out = [_uint(v, f"{field}[{i}]", 0, UINT64_MAX) for i, v in enumerate(value)]
    seen: set[int] = set()
    for i, v in enumerate(out):
        if v in seen:
            raise RefreshError(f"{field}[{i}]", f"duplicate id {v}")
        seen.add(v)
    return out


def _static(raw: Any, f: str) -> dict[str, Any]:
    s = _object(raw, f)
    out: dict[str, Any] = {"group_id": _uint(s.get("group_id"), f"{f}.group_id", 0, UINT64_MAX)}
    out["max_seq_len"] = _uint(s.get("max_seq_len"), f"{f}.max_seq_len", 1)
    if out["max_seq_len"] < 2:
        # max_output_len must lie in [1, max_seq_len - 1]: that range is empty below 2.
        raise RefreshError(
            f"{f}.max_seq_len", f"must be at least 2 so max_output_len can be >= 1, got {out['max_seq_len']}"
        )
    out["max_output_len"] = _uint(s.get("max_output_len"), f"{f}.max_output_len", 1, out["max_seq_len"] - 1)
    out["total_slots_num"] = _uint(s.get("total_slots_num"), f"{f}.total_slots_num", 1, 5000)
    out["total_block_num"] = _uint(s.get("total_block_num"), f"{f}.total_block_num", 1)
    out["block_size"] = _uint(s.get("block_size"), f"{f}.block_size", 1, 128)
    out["label"] = check_label(_uint(s.get("label"), f"{f}.label"), f"{f}.label")
    out["role"] = _uint(s.get("role"), f"{f}.role")
    if out["role"] not in (ROLE_PREFILL, ROLE_DECODE, ROLE_UNDEF):
        raise RefreshError(f"{f}.role", f"must be 80 (prefill), 68 (decode) or 85 (undef), got {out['role']}")
    if out["role"] == ROLE_PREFILL and out["label"] == LABEL_DECODE:
        raise RefreshError(f"{f}.label", "is 3 (decode) but role is 80 (prefill)")
    if out["role"] == ROLE_DECODE and out["label"] == LABEL_PREFILL:
        raise RefreshError(f"{f}.label", "is 2 (prefill) but role is 68 (decode)")
    return out


def check_label(label: int, field: str) -> int:
    """Seed 001: `static_info.label` is 2 (prefill) or 3 (decode), whatever the role."""
    if label not in (LABEL_PREFILL, LABEL_DECODE):
        raise RefreshError(field, f"must be 2 (prefill) or 3 (decode), got {label}")
    return label


def _dynamic(raw: Any, f: str, static: dict[str, Any]) -> dict[str, Any]:
    d = _object(raw, f)
    out: dict[str, Any] = {
        "avail_slots_num": _uint(
            d.get("avail_slots_num"), f"{f}.avail_slots_num", 0, static["total_slots_num"]
        ),
        "avail_block_num": _uint(
            d.get("avail_block_num"), f"{f}.avail_block_num", 0, static["total_block_num"]
        ),
    }
    if static["role"] == ROLE_DECODE:
        if "peers" not in d:
            raise RefreshError(f"{f}.peers", "is required for a decode instance (role 68)")
        out["peers"] = _id_list(d["peers"], f"{f}.peers")
    elif "peers" in d and d["peers"] is not None:
        out["peers"] = _id_list(d["peers"], f"{f}.peers")
    return out


def _extensions(inst: dict[str, Any], f: str, out: dict[str, Any]) -> None:
    engine_type = inst.get("engine_type")
    if engine_type is not None:
        if engine_type not in ENGINE_TYPES:
            raise RefreshError(
                f"{f}.engine_type", f"must be one of {', '.join(ENGINE_TYPES)}, got {engine_type!r}"
            )
        out["engine_type"] = engine_type
    caps = inst.get("capabilities")
    if caps is not None:
        if not isinstance(caps, list) or not all(isinstance(c, str) and c for c in caps):
            raise RefreshError(f"{f}.capabilities", "must be a list of non-empty strings")
        out["capabilities"] = sorted(set(caps))
    bootstrap = inst.get("bootstrap_port")
    if bootstrap is not None:
        out["bootstrap_port"] = _uint(bootstrap, f"{f}.bootstrap_port", 1, 65535)
    if inst.get("endpoints") is not None:
        out["endpoints"] = _endpoints(inst["endpoints"], f"{f}.endpoints")


def _endpoints(value: Any, f: str) -> list[dict[str, Any]]:
    """Motor's per-endpoint form: `{id, ip?, business_port, mgmt_port?, bootstrap_port?}`."""
    if not isinstance(value, list):
        raise RefreshError(f, f"must be a list of endpoints, got {_kind(value)}")
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for k, raw in enumerate(value):
        ef = f"{f}[{k}]"
        e = _object(raw, ef)
        ep: dict[str, Any] = {"id": _uint(e.get("id"), f"{ef}.id")}
        if ep["id"] in seen:
            raise RefreshError(f"{ef}.id", f"duplicate endpoint id {ep['id']}")
        seen.add(ep["id"])
        if e.get("ip") is not None:
            ep["ip"] = _string(e["ip"], f"{ef}.ip")
        ep["business_port"] = _port(e.get("business_port"), f"{ef}.business_port")
        if e.get("mgmt_port") is not None:
            ep["mgmt_port"] = _port(e["mgmt_port"], f"{ef}.mgmt_port")
        if e.get("bootstrap_port") is not None:
            ep["bootstrap_port"] = _uint(e["bootstrap_port"], f"{ef}.bootstrap_port", 1, 65535)
        out.append(ep)
    return out


def validate_instance(inst: Any, f: str) -> dict[str, Any]:
    """One instance of the body, normalised; RefreshError naming the field otherwise."""
    i = _object(inst, f)
    out: dict[str, Any] = {"id": _uint(i.get("id"), f"{f}.id", 0, UINT64_MAX)}
    out["ip"] = _string(i.get("ip"), f"{f}.ip")
    out["port"] = _port(i.get("port"), f"{f}.port")
    out["metric_port"] = _port(i.get("metric_port"), f"{f}.metric_port")
    out["model_name"] = _string(i.get("model_name"), f"{f}.model_name")
    out["static_info"] = _static(i.get("static_info"), f"{f}.static_info")
    out["dynamic_info"] = _dynamic(i.get("dynamic_info"), f"{f}.dynamic_info", out["static_info"])
    _extensions(i, f, out)
    return out


def validate_refresh(body: Any) -> InstancesRefreshedData:
    """Validate a refresh body against every rule of seed 001 (plus Motor's `event`)."""
    b = _object(body, "body")
    event = b.get("event", "set")
    if event not in EVENTS:
        raise RefreshError("event", f"must be one of add, del, set, got {event!r}")
    ids = _id_list(b.get("ids"), "ids")
    raw_instances = b.get("instances")
    if not isinstance(raw_instances, list):
        raise RefreshError("instances", f"is required and must be a list, got {_kind(raw_instances)}")
    if len(raw_instances) > MAX_INSTANCES:
        raise RefreshError("instances", f"has {len(raw_instances)} entries, at most {MAX_INSTANCES} allowed")
    instances = [validate_instance(inst, f"instances[{n}]") for n, inst in enumerate(raw_instances)]
    seen: dict[int, int] = {}
    for n, inst in enumerate(instances):
        if inst["id"] in seen:
            raise RefreshError(
                f"instances[{n}].id",
                f"duplicate instance id {inst['id']} (also instances[{seen[inst['id']]}])",
            )
        seen[inst["id"]] = n
    # `del` may name ids alone; otherwise ids and instances must list the same instances.
    if instances or event != "del":
        missing = [i for i in ids if i not in seen]
        if missing:
            raise RefreshError("ids", f"id {missing[0]} has no entry in instances")
        listed = set(ids)
        extra = [inst["id"] for inst in instances if inst["id"] not in listed]
        if extra:
            raise RefreshError("instances", f"instance id {extra[0]} is not listed in ids")
    return InstancesRefreshedData(event=event, ids=tuple(ids), instances=tuple(instances))
