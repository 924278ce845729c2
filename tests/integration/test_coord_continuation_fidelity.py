"""A stream the coordinator cannot continue faithfully is ended with a clear error event when
its engine dies midway, never continued with a seam and never cut without a word: here a
completions stream asking for logprobs (a continuation's logprobs would start again at the
cut), against a real engine that dies after five tokens and a healthy one beside it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import MODEL, Cluster, start_coordinator, start_engine, wait_routable


async def events_of(s: aiohttp.ClientSession, url: str, body: dict[str, object]) -> list[bytes]:
    async with s.post(url, data=orjson.dumps(body)) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()  # ends cleanly: the stream's last chunk came
    return [b.strip()[5:].strip() for b in raw.split(b"\n\n") if b.strip().startswith(b"data:")]


async def test_a_stream_asking_for_logprobs_ends_with_an_error_event_when_its_engine_dies(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    dying = await start_engine(tmp_path, "union", "--fast", "--die-mid-stream", "5")
    healthy = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, policy={"union": "round_robin"})
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(dying)
        await cluster.add(healthy)
        await wait_routable(c)
        body = {
            "model": MODEL,
            "prompt": "Write a long story",
            "max_tokens": 20,
            "stream": True,
            "logprobs": 1,
        }
        async with aiohttp.ClientSession() as s:
            for _ in range(4):  # round robin: one of the first two streams goes to the dying engine
                events = await events_of(s, f"{c.url}/v1/completions", body)
                if events[-1] != b"[DONE]":
                    break
        assert events[-1] != b"[DONE]", "the dying engine never served the stream"
        last = orjson.loads(events[-1])
        assert "error" in last, events[-3:]
        assert "'logprobs' cannot be continued" in last["error"]["message"]
        assert b"[DONE]" not in events  # it did not pretend to be complete
        tokens = sum(1 for e in events[:-1] if e != b"[DONE]" and orjson.loads(e)["choices"][0]["text"])
        assert tokens == 5  # what the dead engine sent; nothing continued from another
        assert "ended with an error" in c.log_text()
    finally:
        c.stop()
        dying.stop()
        healthy.stop()
