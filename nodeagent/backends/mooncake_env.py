"""`MC_USE_IPV6=1` for Mooncake transfers over IPv6 (RDMA or TCP), unless the environment says.

Seed 002 (NodeManager): when the Mooncake IPv6 switch is on, `MC_USE_IPV6=1` is supplied
unless the environment already defines it. MindIE's switch is
`MOONCAKE_ASCEND_IPV6_EXPERIMENT=1`; an endpoint whose IP is IPv6 and whose KV moves
through Mooncake (a Mooncake connector in vLLM, SGLang's default `mooncake` transfer
backend) needs it as much, so that turns it on too.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from core.events import Role
from nodeagent.backends.launch import LaunchContext

IPV6_VAR = "MC_USE_IPV6"
SWITCH = "MOONCAKE_ASCEND_IPV6_EXPERIMENT"


def is_ipv6(ip: str) -> bool:
    """Whether `ip` is an IPv6 address (not a hostname, not IPv4)."""
    try:
        return ipaddress.ip_address(ip.strip("[]")).version == 6
    except ValueError:
        return False


def _connector_names(ktc: Any) -> list[str]:
    if not isinstance(ktc, dict):
        return []
    names = [ktc.get("kv_connector")]
    extra = ktc.get("kv_connector_extra_config")
    subs = (extra or {}).get("connectors") if isinstance(extra, dict) else None
    for sub in [*(subs or []), *(ktc.get("connectors") or [])]:
        if isinstance(sub, dict):
            names.append(sub.get("kv_connector"))
    return [str(n) for n in names if n]


def uses_mooncake(ctx: LaunchContext) -> bool:
    """Whether this endpoint's KV moves through Mooncake."""
    sec = ctx.section
    if sec.engine_type == "sglang":
        if ctx.role == Role.UNION:
            return False
        backend = sec.engine_value("disaggregation_transfer_backend", "mooncake")
        return str(backend).lower() == "mooncake"
    return any("mooncake" in n.lower() for n in _connector_names(sec.engine_value("kv_transfer_config")))


def ipv6_env(ctx: LaunchContext) -> dict[str, str]:
    """`{"MC_USE_IPV6": "1"}` when this endpoint needs it and nobody set it; else nothing."""
    env = {**ctx.environ, **ctx.section.env}
    if IPV6_VAR in env:
        return {}
    if env.get(SWITCH) == "1" or (is_ipv6(ctx.endpoint.ip) and uses_mooncake(ctx)):
        return {IPV6_VAR: "1"}
    return {}
