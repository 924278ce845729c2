"""What a node agent's `/node-manager/status` shows: its registration and each engine."""

from __future__ import annotations

from typing import Any

from nodeagent.engines import Engines
from nodeagent.settings import AgentSettings
from nodeagent.snapshot import Snapshot


def agent_status(
    s: AgentSettings,
    job_name: str,
    registered: bool,
    ready: bool,
    engines: Engines | None,
    snapshot: Snapshot | None,
) -> dict[str, Any]:
    eps = engines.endpoints.values() if engines is not None else []
    return {
        "status": ready,
        "node_id": s.node_id,
        "role": s.role.value,
        "job_name": job_name,
        "engine_type": s.section.engine_type,
        "registered": registered,
        "instance_id": engines.instance_id if engines is not None else None,
        "snapshot": snapshot.phase.value if snapshot and snapshot.phase else None,
        "endpoints": [
            {
                "id": ep.spec.id,
                "status": ep.status.value if ep.status else None,
                "reason": ep.reason,
                "pid": ep.proc.pid,
                "live": ep.live,
                "business_port": ep.spec.business_port,
                "exit_code": ep.exit_code,
                "log_file": str(ep.log_file),
            }
            for ep in eps
        ],
    }
