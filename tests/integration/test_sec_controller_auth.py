"""Controller auth (issue 12, item 2) and secrets kept out of `/debug/state` (item 5), against
a real `motor controller` process.
"""

from __future__ import annotations

import time

import orjson
import pytest

from core.events import InstancesRefreshed, InstancesRefreshedData
from core.ids import new_id
from streams.publisher import Publisher
from tests.integration.controller_harness import Cluster
from tests.integration.rawhttp import exchange, request

KEY = "controller-key-1"


async def test_the_controller_api_needs_a_key_probes_do_not(cluster: Cluster) -> None:
    cluster.configure(union=1, api_keys=[KEY])
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    for path in ("/v1/instances", "/v1/alarms", "/debug/state", "/openapi.json", "/", "/v1%2Finstances"):
        r = await exchange(ctl.port, request("GET", path))
        assert r.status == 401, (path, r)
        err = r.json()["error"]  # type: ignore[index]
        assert err["type"] == "authentication_error" and err["message"]
        wrong = {"authorization": f"Bearer {KEY}-"}
        assert (await exchange(ctl.port, request("GET", path, headers=wrong))).status == 401
    for headers in (
        {"authorization": f"Bearer {KEY}"},
        {"x-api-key": KEY},
        {"Authorization": f"bearer {KEY}"},
    ):
        r = await exchange(ctl.port, request("GET", "/v1/instances", headers=headers))
        assert r.status == 200, r
    for path in ("/liveness", "/readiness", "/metrics"):
        assert (await exchange(ctl.port, request("GET", path))).status == 200, path


async def test_the_controllers_errors_share_the_coordinators_vocabulary(cluster: Cluster) -> None:
    # Once FastAPI's own `{"detail": ...}` on a path or method it has no route for, and 404
    # typed invalid_request_error by the controller's own table.
    cluster.configure(union=1)
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    r = await exchange(ctl.port, request("GET", "/no/such/path"))
    assert r.status == 404 and r.json() == {
        "error": {"message": "no route for /no/such/path", "type": "not_found_error", "code": "not_found"}
    }
    r = await exchange(ctl.port, request("POST", "/v1/instances"))
    assert r.status == 405 and r.json() == {
        "error": {
            "message": "POST is not allowed on /v1/instances",
            "type": "invalid_request_error",
            "code": "method_not_allowed",
        }
    }


async def test_the_controller_key_can_come_from_the_environment(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOTOR_CONTROLLER_API_KEYS", f"{KEY}, other-key")
    cluster.configure(union=1)
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    assert (await exchange(ctl.port, request("GET", "/v1/instances"))).status == 401
    ok = {"authorization": "Bearer other-key"}
    assert (await exchange(ctl.port, request("GET", "/v1/instances", headers=ok))).status == 200


async def test_debug_state_masks_secrets(cluster: Cluster) -> None:
    cluster.configure(union=1)
    ctl = cluster.controller("c1")
    await ctl.wait_http("/readiness")
    # An external instance written by some other tool, carrying credentials in its record.
    inst = {
        "id": 5,
        "ip": "127.0.0.1",
        "port": "1040",
        "model_name": "m",
        "api_key": "sk-live-123456",
        "metrics_url": "http://scraper:hunter2@10.0.0.1:9090/metrics",
        "static_info": {
            "role": 85,
            "label": 2,
            "max_seq_len": 8,
            "max_output_len": 4,
            "auth_token": "tok-999",
        },
    }
    ev = InstancesRefreshed(
        id=new_id(), ts=time.time(), source="test", data=InstancesRefreshedData(ids=(5,), instances=(inst,))
    )
    await Publisher(cluster.nc.jetstream()).publish(ev)
    deadline = time.monotonic() + 20
    while True:
        r = await exchange(ctl.port, request("GET", "/debug/state"))
        assert r.status == 200
        state = orjson.loads(r.body)
        if state["external"]:
            break
        assert time.monotonic() < deadline, "the controller never folded the refresh"
    text = r.body.decode()
    for secret in ("sk-live-123456", "hunter2", "tok-999"):
        assert secret not in text
    ext = state["external"]["5"]
    assert ext["api_key"] == "***" and ext["static_info"]["auth_token"] == "***"
    assert ext["metrics_url"] == "http://scraper:***@10.0.0.1:9090/metrics"
    assert ext["static_info"]["max_seq_len"] == 8  # only secrets are masked
