"""The management API against a real nats-server and a real HTTP server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext

from coordinator.context import CoordinatorContext
from coordinator.table import RoutingTable
from core.codec import encode
from core.coordconfig import CoordinatorConfig
from core.events import EndpointStatus, InstanceState, Role
from streams.definitions import MOTOR_STREAM
from streams.reader import read_range
from tests.integration.coord_mgmt_harness import running_mgmt
from tests.unit.coord_events import (
    alarm,
    endpoint_status,
    heartbeat,
    instance_events,
    instance_state,
    seed_instance,
)


def seed_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ids": [0, 1],
        "instances": [seed_instance(0, 80, 2, port="1025"), seed_instance(1, 68, 3, port="1027", peers=[0])],
    }
    body.update(extra)
    return body


def is_openai_error(body: Any, status_type: str | None = None) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    ok = isinstance(err, dict) and set(err) == {"message", "type", "code"} and isinstance(err["message"], str)
    return ok and (status_type is None or err["type"] == status_type)


async def test_probes_follow_the_log_and_routability(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        await asyncio.wait_for(h.ctx.caught_up.wait(), 20)
        status, body, _ = await h.get("/liveness")
        assert status == 200 and body["status"] == "ok"
        assert (await h.get("/startup"))[0] == 200
        status, body, _ = await h.get("/readiness")
        assert status == 503 and is_openai_error(body, "service_unavailable")
        assert body["error"]["message"] == "no instance is registered"
        # An instance that is assembled but still starting: known, not routable.
        await h.append(*instance_events(1, Role.UNION, status=EndpointStatus.STARTING))
        status, body, _ = await h.get("/readiness")
        assert status == 503 and "STARTING" in body["error"]["message"]
        await h.append(endpoint_status("n1", 0, EndpointStatus.READY, 1))
        status, body, _ = await h.get("/readiness")
        assert status == 200 and body["routable_endpoints"] == 1
        assert (await h.get("/health"))[0] == 200
        # An instance the controller isolates leaves routing, and readiness says so.
        await h.append(instance_state(1, InstanceState.ISOLATED))
        status, body, _ = await h.get("/readiness")
        assert status == 503 and "ISOLATED" in body["error"]["message"]


async def test_startup_waits_for_the_replay(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js, follow=False) as h:
        status, body, _ = await h.get("/startup")
        assert status == 503 and body["error"]["code"] == "starting"
        assert (await h.get("/readiness"))[1]["error"]["message"] == "replaying the event log"
        assert (await h.get("/liveness"))[0] == 200


async def test_root_lists_the_management_endpoints(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        status, body, _ = await h.get("/")
        assert status == 200 and body["service"] == "Motor Coordinator Management Server"
        assert "POST /precision/alarm_cleared" in body["endpoints"]


async def test_refresh_appends_an_event_and_routes_external_engines(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        await asyncio.wait_for(h.ctx.caught_up.wait(), 20)
        status, body = await h.post("/v1/instances/refresh", seed_body())
        assert (status, body) == (200, b"")  # seed 001: no body on success
        # Read your writes: this replica already routes them.
        status, listing, _ = await h.get("/v1/instances")
        assert status == 200
        rows = {r["key"]: r for r in listing["data"]}
        assert (
            rows["ext/0"]["role"] == "prefill" and rows["ext/0"]["port"] == 1025 and rows["ext/0"]["routable"]
        )
        assert rows["ext/1"]["role"] == "decode" and rows["ext/1"]["routable"]
        assert listing["plans"]["your_model_name"]["kind"] == "pd"
        # The log holds exactly that fact.
        records = [r async for r in read_range(nc, MOTOR_STREAM)]
        assert [r.event.type for r in records] == ["instances.refreshed"]
        ev = records[0].event
        assert ev.data.event == "set" and ev.data.ids == (0, 1)  # type: ignore[union-attr]
        # Motor's alias and `del`.
        status, _ = await h.post("/instances/refresh", {"event": "del", "ids": [1], "instances": []})
        assert status == 200
        assert [r["key"] for r in (await h.get("/v1/instances"))[1]["data"]] == ["ext/0"]
        # Another replica replaying the log routes the same way.
        other = RoutingTable()
        async for rec in read_range(nc, MOTOR_STREAM):
            other.apply(rec.event, rec.seq)
        assert [e.key for e in other.routable()] == [e.key for e in h.ctx.table.routable()] == ["ext/0"]


DELETE = object()


async def test_refresh_rejects_bad_bodies_naming_the_field(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js, CoordinatorConfig(max_body_bytes=4096)) as h:
        bad = seed_body()
        bad["instances"][0]["static_info"]["block_size"] = 256
        status, body = await h.post("/v1/instances/refresh", bad)
        assert status == 400 and is_openai_error(body, "invalid_request_error")
        assert body["error"]["message"].startswith("instances[0].static_info.block_size: must be in [1, 128]")
        status, body = await h.post("/v1/instances/refresh", raw=b'{"ids": [0,')
        assert status == 400 and body["error"]["code"] == "invalid_json"
        status, body = await h.post("/v1/instances/refresh", raw=b"")
        assert status == 400 and is_openai_error(body)
        status, body = await h.post("/v1/instances/refresh", raw=b'{"pad": "' + b"x" * 5000 + b'"}')
        assert status == 413 and is_openai_error(body)
        # An instance without a valid id — the event that crashed the controller's fold when a
        # client appended it directly — never gets past the API.
        for bad_id, field in (
            (DELETE, "instances[0].id"),
            (None, "instances[0].id"),
            ("0", "instances[0].id"),
        ):
            bad = seed_body()
            if bad_id is DELETE:
                del bad["instances"][0]["id"]
            else:
                bad["instances"][0]["id"] = bad_id
            status, body = await h.post("/v1/instances/refresh", bad)
            assert status == 400 and body["error"]["message"].startswith(f"{field}: "), body
        bad = seed_body()
        bad["instances"][1] = "not an instance"
        status, body = await h.post("/v1/instances/refresh", bad)
        assert status == 400 and body["error"]["message"].startswith("instances[1]: "), body
        # Nothing reached the log.
        assert [r async for r in read_range(nc, MOTOR_STREAM)] == []
        metrics = (await h.get("/metrics"))[1].decode()
        assert 'motor_coordinator_instance_refreshes_total{result="rejected"} 8.0' in metrics


async def test_alarm_cleared_follows_seed_002(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        await h.append(
            *instance_events(1, Role.PREFILL, capabilities=("handoff",)),
            *instance_events(2, Role.DECODE, capabilities=("handoff",)),
        )
        await h.append(alarm(2, p_instance_id=1))
        assert h.ctx.table.plan("motor-sim").kind == "none"
        assert (await h.get("/readiness"))[0] == 503
        status, body = await h.post("/precision/alarm_cleared", {"d_instance_id": 2, "p_instance_id": 1})
        assert status == 200
        assert body == {
            "request_id": "precision_alarm_cleared",
            "status": "success",
            "message": "Precision alarm state cleared",
            "data": {"dismissed": True},
        }
        assert h.ctx.table.plan("motor-sim").kind == "pd"
        assert (await h.get("/readiness"))[0] == 200
        records = [r.event async for r in read_range(nc, MOTOR_STREAM)]
        cleared = records[-1]
        assert cleared.type == "precision.alarm_cleared"
        assert (cleared.data.d_instance_id, cleared.data.p_instance_id) == (2, 1)  # type: ignore[union-attr]
        assert cleared.data.alarm_id == records[-2].data.alarm_id  # type: ignore[union-attr]
        # Clearing again is harmless and says nothing was dismissed.
        status, body = await h.post("/precision/alarm_cleared", {"d_instance_id": 2})
        assert status == 200 and body["data"] == {"dismissed": False}


async def test_alarm_cleared_rejects_bad_bodies(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        for payload, field in (
            ({}, "d_instance_id"),
            ({"d_instance_id": "2"}, "d_instance_id"),
            ({"d_instance_id": -1}, "d_instance_id"),
            ({"d_instance_id": True}, "d_instance_id"),
            ({"d_instance_id": 2, "p_instance_id": "x"}, "p_instance_id"),
            ([2], "body"),
        ):
            status, body = await h.post("/precision/alarm_cleared", payload)
            assert status == 400 and is_openai_error(body), payload
            assert body["error"]["message"].startswith(field + ":"), body


async def test_metrics_expose_the_table(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        await h.append(*instance_events(1, Role.UNION, endpoints=2))
        await h.publisher.publish(heartbeat("n1", (0, 3, 2), (1, 1, 0)))
        ep = h.ctx.table.endpoint("n1/0")
        assert ep is not None
        deadline = asyncio.get_running_loop().time() + 20
        while ep.running != 3:  # heartbeats have their own stream; nothing to await per message
            assert asyncio.get_running_loop().time() < deadline, "heartbeat not folded"
            await asyncio.sleep(0.02)
        ep.inflight = 4
        status, text, headers = await h.get("/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        metrics = text.decode()
        assert 'motor_coordinator_endpoint_load{endpoint="n1/0",role="union"} 5.0' in metrics
        assert 'motor_coordinator_endpoint_inflight{endpoint="n1/0",role="union"} 4.0' in metrics
        assert 'motor_coordinator_routable_endpoints{model="motor-sim",role="union"} 2.0' in metrics
        assert "motor_coordinator_caught_up 1.0" in metrics


async def test_unknown_paths_and_methods_are_openai_errors(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        status, body, _ = await h.get("/nope")
        assert status == 404 and is_openai_error(body) and "/nope" in body["error"]["message"]
        status, body, _ = await h.get("/v1/instances/refresh")
        assert status == 405 and is_openai_error(body)


async def test_writes_without_an_event_log_are_503(nc: Client, js: JetStreamContext) -> None:
    async with running_mgmt(nc, js) as h:
        h.ctx.publisher = None
        status, body = await h.post("/v1/instances/refresh", seed_body())
        assert status == 503 and body["error"]["code"] == "no_event_log"


async def test_wait_applied_without_a_fold_of_the_log_is_false_at_once() -> None:
    ctx = CoordinatorContext()
    started = time.monotonic()
    assert not await ctx.wait_applied(5, 10.0)
    assert time.monotonic() - started < 1.0


async def test_poison_events_are_skipped_counted_and_the_table_folds_on(
    nc: Client, js: JetStreamContext
) -> None:
    async with running_mgmt(nc, js) as h:
        await asyncio.wait_for(h.ctx.caught_up.wait(), 20)
        await js.publish("motor.evt.fault.rogue", b"{not json")
        body = orjson.loads(encode(alarm(9))) | {"id": "u1", "type": "node.exploded"}
        await js.publish("motor.evt.fault.rogue", orjson.dumps(body))
        body = orjson.loads(encode(alarm(9))) | {"id": "v99", "schema_version": 99}
        await js.publish("motor.evt.precision.9", orjson.dumps(body))
        await h.append(alarm(4))  # folded after the poison
        assert 4 in h.ctx.table.state.alarms
        text = (await h.get("/metrics"))[1].decode()
        for reason in ("undecodable", "unknown_type", "newer_schema"):
            assert f'motor_coordinator_events_skipped_total{{reason="{reason}"}} 1.0' in text
