"""Poison in the log, published by a plain NATS client as anyone with publish rights could:
every folding component (both controllers, the coordinator) skips and counts what it cannot
apply, folds on past it, and `motor replay` reads the log. One coordinator here, so its
/metrics and fold position are the only replica's."""

from __future__ import annotations

import asyncio
import re
import time

import orjson
import pytest

from core.ids import new_id
from tests.chaos import invariants as inv
from tests.chaos.conftest import ClusterPool
from tests.chaos.faults import MUST_SKIP, POISON_KINDS, publish_poison, publish_sentinel
from tests.chaos.fleet import scrape
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

FOLD_WITHIN = 15.0


@pytest.fixture
async def single(pool: ClusterPool) -> ChaosCluster:
    return await pool.get(coordinators=1)


def metrics_urls(cc: ChaosCluster) -> dict[str, str]:
    urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in cc.controller_ports().items()}
    urls["coordinator"] = cc.cluster.coordinator_url + "/metrics"
    return urls


async def skipped(cc: ChaosCluster) -> dict[str, float]:
    """component -> motor_*_events_skipped_total summed over reasons (-1: no answer)."""
    out = {}
    for comp, url in metrics_urls(cc).items():
        text = await scrape(url)
        out[comp] = sum(inv.skipped_counts(text).values()) if text is not None else -1.0
    return out


async def folded_past(cc: ChaosCluster, seq: int) -> dict[str, bool]:
    """Whether each component folded the log up to `seq` (within FOLD_WITHIN)."""
    deadline = time.monotonic() + FOLD_WITHIN
    done: dict[str, bool] = {}
    while True:
        for name in cc.controller_ports():
            done[name] = done.get(name, False) or await cc.controller_seq(name) >= seq
        body = await scrape(cc.cluster.coordinator_url + "/startup")
        done["coordinator"] = done.get("coordinator", False) or (
            body is not None and orjson.loads(body)["log_seq"] >= seq
        )
        if all(done.values()) or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.2)


async def replay_reads(cc: ChaosCluster, kind: str) -> inv.Check:
    """`motor replay` folds the log with the poison in it and says what it skipped."""
    out = await cc.motor("replay")
    text = out.stdout + out.stderr
    said = re.search(r"replayed \d+ events[^;]*;\s+(\d+)\s+skipped", text)
    if out.returncode != 0 or "Traceback" in text:
        tail = text.strip().splitlines()[-1:] or ["(no output)"]
        return inv.Check("5 motor replay reads it", False, f"exit {out.returncode}: {tail[0]}")
    if said is None or (kind in MUST_SKIP and int(said.group(1)) < 1):
        return inv.Check("5 motor replay reads it", False, "does not say it skipped the poison")
    return inv.Check("5 motor replay reads it", True, said.group(0).strip())


@pytest.mark.parametrize("kind", POISON_KINDS)
async def test_poison_event(single: ChaosCluster, kind: str) -> None:
    sc = await Scenario.begin(single, f"poison: {kind}")
    node = "union-0"
    tag = new_id()[:12]
    before = await skipped(single)
    async with sc.traffic(clients=3):
        sc.fault(time.time())
        stored = await publish_poison(single.admin, kind, node, tag)
        sentinel = await publish_sentinel(single.admin, node, tag)
        folded = await folded_past(single, sentinel)
        t = time.time()
        took = await sc.converge(t, floor=1.0)
    after = await skipped(single)
    delta = {c: (after[c] - before[c]) if after[c] >= 0 and before[c] >= 0 else 0.0 for c in after}
    sc.check(inv.poison_handled(kind, skipped_delta=delta, must_skip=kind in MUST_SKIP, folded_past=folded))
    if kind == "duplicate Nats-Msg-Id":
        sc.check(inv.Check("5 duplicate stored once", len(stored) == 1, f"stored at seq {stored}"))
    sc.check(await replay_reads(single, kind))
    await sc.common(fault_ended=t, took=took)
    sc.finish()
