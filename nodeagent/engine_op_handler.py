"""Carrying out `command.engine_op`: run the op on this node's engines, answer with the results.

Every live engine of the instance the command names gets the op at once (`nodeagent.engine_ops`
maps it to the engine kind's route); the answer is one `node.engine_op_completed` carrying a
result per engine. Its id derives from the command's, so an answer sent again is one.
"""

from __future__ import annotations

import asyncio
import logging
import time

from core.events import EngineOpCommand, EngineOpCompleted, EngineOpCompletedData, EngineOpResult
from core.ids import derive_id
from nodeagent.engine_ops import run_one
from nodeagent.engines import Engines
from nodeagent.errors import Refusal

log = logging.getLogger(__name__)


def engine_op_answer(
    node_id: str,
    source: str,
    cmd: EngineOpCommand,
    results: tuple[EngineOpResult, ...] = (),
    *,
    refused: Refusal | None = None,
    ts: float | None = None,
) -> EngineOpCompleted:
    """The event answering `cmd`: its results, or why it was not run."""
    d = cmd.data
    data = EngineOpCompletedData(
        command_id=d.command_id,
        op_id=d.op_id,
        node_id=node_id,
        instance_id=d.instance_id,
        op=d.op,
        args=d.args,
        results=results,
        refused=f"{refused.code}: {refused.reason}" if refused is not None else "",
    )
    eid = derive_id("command-result", node_id, d.command_id)
    return EngineOpCompleted(id=eid, ts=time.time() if ts is None else ts, source=source, data=data)


async def run_engine_op(
    engines: Engines, engine_type: str, cmd: EngineOpCommand, within: float
) -> tuple[EngineOpResult, ...]:
    """Run the command's op on every live engine of its instance here (none: no results)."""
    d = cmd.data
    if d.instance_id is not None and engines.instance_id != d.instance_id:
        log.info(
            "engine op %s for instance %s, this node runs %s: nothing to do",
            d.command_id,
            d.instance_id,
            engines.instance_id,
        )
        return ()
    eps = sorted(
        (ep for ep in engines.endpoints.values() if ep.live and ep.serves_http), key=lambda ep: ep.spec.id
    )
    base = [ep.url("") for ep in eps]
    results = await asyncio.gather(
        *(
            run_one(engines.host.call, engine_type, b, ep.spec.id, d.op, d.args, within)
            for b, ep in zip(base, eps, strict=True)
        )
    )
    for r in results:
        log.info(
            "engine op %s (%s) on endpoint %d: %s %s", d.command_id, d.op, r.endpoint_id, r.outcome, r.detail
        )
    return tuple(results)
