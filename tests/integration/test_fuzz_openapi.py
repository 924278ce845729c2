"""Schemathesis over the OpenAPI descriptions of the coordinator's management app and the
controller's API (issue 12): positive and negative cases for every operation, with the admin
(or controller) key. Zero 5xx, every 4xx with a well-formed error body, no process lost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import schemathesis
from hypothesis import given
from hypothesis.errors import Unsatisfiable
from nats.js import JetStreamContext
from schemathesis import GenerationMode

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.controller_harness import Cluster
from tests.integration.coord_harness import Cluster as Routes
from tests.integration.coord_harness import free_port, start_coordinator, start_engine, wait_routable
from tests.integration.fuzz import SETTINGS, check_reply
from tests.integration.rawhttp import Reply

ADMIN = "schema-admin-key"


def _fuzz_schema(base: str, headers: dict[str, str]) -> list[str]:
    """Run every operation's positive and negative cases; the operations covered."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=headers)
    covered = []
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @SETTINGS
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                resp = case.call(base_url=base, headers=headers, timeout=30)
                check_reply(Reply(status=resp.status_code, body=resp.content, complete=True))

            try:
                run()
            except Unsatisfiable:
                # Nothing to make invalid (an operation with no parameters nor body).
                assert mode is GenerationMode.NEGATIVE, op.label
        covered.append(f"{op.method.upper()} {op.path}")
    return covered


async def test_schemathesis_over_the_management_api(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    mport = free_port()
    engine = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(
        tmp_path, nats_server.url, api_keys=["u"], admin_keys=[ADMIN], mgmt_port=mport
    )
    try:
        # Something routable, so the probes answer 200: their 503 means "not ready", no fault.
        await Routes(Publisher(js)).add(engine)
        await wait_routable(c, headers={"authorization": "Bearer u"})
        base = f"http://127.0.0.1:{mport}"
        covered = await asyncio.to_thread(_fuzz_schema, base, {"authorization": f"Bearer {ADMIN}"})
        assert {"POST /v1/instances/refresh", "POST /precision/alarm_cleared", "GET /v1/instances"} <= set(
            covered
        )
        assert c.proc.poll() is None
        assert "Traceback" not in c.log_text(), c.log_text()[-3000:]
    finally:
        c.stop()
        engine.stop()


async def test_schemathesis_over_the_controller_api(cluster: Cluster) -> None:
    key = "schema-controller-key"
    cluster.configure(union=1, api_keys=[key])
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    covered = await asyncio.to_thread(_fuzz_schema, ctl.url, {"authorization": f"Bearer {key}"})
    assert {"GET /v1/instances", "GET /debug/state", "GET /liveness"} <= set(covered)
    assert ctl.proc is not None and ctl.proc.poll() is None
    assert "Traceback" not in ctl.output(), ctl.output()[-3000:]
