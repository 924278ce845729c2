"""Why did this request go there (issue 20 item 3), against a real coordinator, real engines
and a real nats-server: every request's routing record is in the coordinator's ring
(`GET /v1/requests/{id}`, by its id or the client's x-request-id); a retried one is in
MOTOR_REQ, an ordinary one is not (no sample configured); `motor replay --request` shows it
beside the table it was routed on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
from nats.js import JetStreamContext

from core.events import EndpointStatus
from core.requestlog import REQ_STREAM, RequestRecorded, subject_of
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import MODEL, Cluster, start_coordinator, start_engine, wait_routable
from tests.integration.test_replay_cli import motor


async def records(js: JetStreamContext) -> list[dict[str, Any]]:
    info = await js.stream_info(REQ_STREAM)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        msg = await js.get_msg(REQ_STREAM, seq)
        out.append(RequestRecorded.model_validate_json(msg.data or b"").data.model_dump())
    return out


async def test_a_retried_request_is_recorded_and_explained(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    good = await start_engine(tmp_path, "union", "--fast")
    bad = await start_engine(tmp_path, "union", "--fast", "--error-rate", "1.0")
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        retries=3,
        breaker={"failures": 50, "backoff_initial": 60, "backoff_max": 60},
        policy={"union": "round_robin"},
    )
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(good)
        bad_iid = await cluster.add(bad)
        await wait_routable(c)
        client = openai.AsyncOpenAI(base_url=f"{c.url}/v1", api_key="none", max_retries=0)
        ids = []
        for i in range(4):  # round robin: each meets the failing engine first, until it leaves
            if i == 2:
                await cluster.status(bad, bad_iid, EndpointStatus.ABNORMAL, EndpointStatus.READY)
                await asyncio.sleep(0.5)
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt="hello", max_tokens=4, extra_headers={"x-request-id": f"client-{i}"}
            )
            assert raw.http_response.status_code == 200
            ids.append(raw.http_response.headers["x-request-id"])
        await client.close()
        assert ids == [f"client-{i}" for i in range(4)]  # the client's own id comes back

        async with aiohttp.ClientSession() as s:
            views = {}
            for cid in ids:
                async with s.get(f"{c.url}/v1/requests/{cid}") as r:
                    assert r.status == 200, await r.text()
                    views[cid] = orjson.loads(await r.read())
            async with s.get(f"{c.url}/v1/requests/nobody") as r:
                assert r.status == 404
                assert "motor replay --request" in (await r.json())["error"]["message"]
        retried = [v for v in views.values() if "retried" in v["why"]]
        plain = [v for v in views.values() if v["why"] == ["ok"]]
        assert retried and plain
        rec = retried[0]
        first, second = rec["attempts"][:2]
        assert (first["endpoint"], first["outcome"]) == (f"n{bad.port}/0", "retry:http_5xx")
        assert (second["endpoint"], second["outcome"]) == (f"n{good.port}/0", "answered")
        assert {x["endpoint"] for x in first["candidates"]} == {f"n{good.port}/0", f"n{bad.port}/0"}
        assert second["excluded"] == [f"n{bad.port}/0"]
        assert rec["status"] == 200 and rec["log_seq"] > 0

        # MOTOR_REQ holds the retried ones, not the ordinary ones (no sample is configured).
        deadline = time.monotonic() + 10
        while True:
            stored = [r for r in await records(js) if r["client_id"]]  # not wait_routable's pings
            if len(stored) >= len(retried):
                break
            assert time.monotonic() < deadline, stored
            await asyncio.sleep(0.1)
        # (wait_routable's pings, sent with no x-request-id, may have met the failing engine too)
        assert sorted(r["client_id"] for r in stored if r["client_id"]) == sorted(
            v["client_id"] for v in retried
        )
        msg = await js.get_last_msg(REQ_STREAM, subject_of(rec["request_id"]))
        assert msg.data is not None and b"retry:http_5xx" in msg.data

        rc, out, err = await motor("replay", "--request", rec["client_id"], url=nats_server.url)
        assert rc == 0, err
        assert f"x-request-id {rec['client_id']}" in out
        assert "retry:http_5xx" in out and "answered" in out
        assert f"excluded (failed this request): n{bad.port}/0" in out
        assert f"what the coordinator knew at seq {rec['log_seq']}" in out
        assert f"n{good.port}/0" in out and "routable" in out
        rc, _, err = await motor("replay", "--request", plain[0]["client_id"], url=nats_server.url)
        assert rc == 1 and "no record of request" in err
        page = tmp_path / "timeline.html"
        rc, out, err = await motor("replay", "--timeline", str(page), url=nats_server.url)
        assert rc == 0, err
        html = page.read_text()
        assert "requests (routing records)" in html and rec["request_id"] in html  # the timeline marks it
    finally:
        c.stop()
        good.stop()
        bad.stop()
