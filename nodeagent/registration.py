"""What a node registers: endpoints with their ports, parallel config, capacity, capabilities.

Pure: built from the agent settings and its engine section; the agent adds what it runs.
"""

from __future__ import annotations

from pydantic import ValidationError

from core.config import EngineSection
from core.events import EndpointSpec, NodeRegisteredData, ParallelConfig, Role
from nodeagent.backends import backend_for
from nodeagent.backends.launch import int_option
from nodeagent.errors import StartupError
from nodeagent.settings import AgentSettings, split_devices


def bootstrap_ports(section: EngineSection, role: Role, engine_port_base: int) -> list[int | None]:
    """The P/D bootstrap port of each endpoint of a node (None where there is none).

    Configured (`engine_config.disaggregation_bootstrap_port`) it is the first endpoint's and
    the next ones count up. A builtin prefill engine without one takes the port right after
    its business ports, so agents sharing a host never collide.
    """
    n = section.endpoints_per_node()
    first = section.bootstrap_port()
    if first is None and section.engine_type == "builtin" and role == Role.PREFILL:
        caps = backend_for("builtin").capabilities(section, role)
        if "bootstrap" in caps:
            first = engine_port_base + n
    if first is None:
        return [None] * n
    return [first + i for i in range(n)]


def plan_endpoints(
    section: EngineSection, role: Role, ip: str, engine_port_base: int
) -> tuple[EndpointSpec, ...]:
    """One endpoint per DP rank served by this node, business ports counted from the base."""
    n = section.endpoints_per_node()
    if engine_port_base + n - 1 > 65535:
        raise StartupError(f"--engine-port-base {engine_port_base} leaves no room for {n} endpoints")
    boot = bootstrap_ports(section, role, engine_port_base)
    for port in boot:
        if port is not None and not 0 < port <= 65535:
            raise StartupError(f"engine_config.disaggregation_bootstrap_port gives port {port}, out of range")
    return tuple(
        EndpointSpec(
            id=i,
            ip=ip,
            business_port=engine_port_base + i,
            # Native engines serve health and metrics on the business port; kept for the protocol.
            mgmt_port=engine_port_base + i,
            bootstrap_port=boot[i],
            dp_rank=i,
        )
        for i in range(n)
    )


def parallel_config(section: EngineSection) -> ParallelConfig:
    """TP/PP/DP sizes under the names vLLM and SGLang use."""
    return ParallelConfig(
        tp=int_option(section, 1, "tensor_parallel_size", "tp_size", "tp"),
        pp=int_option(section, 1, "pipeline_parallel_size", "pp_size"),
        dp=max(section.dp_size(), int_option(section, 1, "dp_size")),
        dp_local=section.endpoints_per_node(),
        nnodes=section.nodes_per_instance(),
    )


def build_registration(
    settings: AgentSettings,
    *,
    agent_url: str | None = None,
    instance_id: int | None = None,
    running_endpoints: tuple[int, ...] = (),
    restored: bool = False,
    job_name: str | None = None,
) -> NodeRegisteredData:
    """The `node.registered` payload; raises StartupError for a config that cannot run."""
    try:
        return _registration(settings, agent_url, instance_id, running_endpoints, restored, job_name)
    except ValidationError as exc:
        # An engine option (or a setting) gives a number no registration may carry.
        raise StartupError(f"this node cannot register: {_fields(exc)}") from None


def _fields(exc: ValidationError) -> str:
    return "; ".join(
        f"{exc.title} {'.'.join(str(p) for p in e['loc'])} = {e['input']!r}: {e['msg']}"
        for e in exc.errors()[:3]
    )


def _registration(
    settings: AgentSettings,
    agent_url: str | None,
    instance_id: int | None,
    running_endpoints: tuple[int, ...],
    restored: bool,
    job_name: str | None,
) -> NodeRegisteredData:
    section = settings.section
    backend = backend_for(section.engine_type)
    endpoints = plan_endpoints(section, settings.role, settings.ip, settings.engine_port_base)
    for ep in endpoints:
        split_devices(settings.devices, len(endpoints), ep.id)  # fail early on an uneven split
    return NodeRegisteredData(
        node_id=settings.node_id,
        job_name=job_name or settings.job_name,
        pod_ip=settings.ip,
        role=settings.role,
        engine_type=section.engine_type,
        model=section.model,
        devices=settings.devices,
        endpoints=endpoints,
        parallel=parallel_config(section),
        capacity=backend.capacity(section),
        capabilities=backend.capabilities(section, settings.role),
        agent_url=agent_url,
        instance_id=instance_id,
        running_endpoints=running_endpoints,
        restored=restored,
    )
