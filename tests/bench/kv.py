"""`just bench kv`: prefix hit rate and TTFT of kv_aware against the other policies, one run.

Multi-turn chat sessions, each opening with one of a few shared system prompts, on four
builtin engines with the KV cache model (timed, so an uncached prompt token costs prefill
time) and KV events on, behind a whole local cluster (nats-server, controller, node agents
publishing the KV view, one coordinator). For each policy in turn a fresh cluster serves the
same sessions (same seed): hit rate is what the engines themselves count (prefix cache hit
tokens over prompt tokens), TTFT the client's time to the first streamed token. The oracle
hit rate is the workload's own: a request hits every prompt block any earlier request's prompt
had (one infinite cache shared by all), with the engine's rule that the last prompt token is
always computed.

The defaults: two ~1,200-token (~9 KB) system prompts shared by 42 sessions of six turns, each
turn adding ~150 tokens of user text and 24 of answer, 14 sessions at once, 1,024 blocks of 16
tokens an engine (evictions happen), engines computing 5,000 uncached prompt tokens a second
(so a miss shows in TTFT above this shared machine's noise), two coordinator replicas,
connections landing on either. A concurrency that is a multiple of the engine count lets
round_robin's rotation bring lock-stepped sessions back to the same engine by accident.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from core.events import InstanceState
from core.kvblocks import prompt_chain
from core.kvprompt import builtin_prompt_ids
from tests.bench._measure import samples_sum
from tests.localcluster import Harness, cluster_config, running_cluster

POLICIES = ("kv_aware", "prefix_affinity", "least_load", "round_robin")
BLOCK = 16
WORDS = [
    "cluster",
    "engine",
    "routing",
    "prefill",
    "decode",
    "cache",
    "block",
    "token",
    "stream",
    "replica",
    "policy",
    "node",
    "agent",
    "controller",
    "event",
    "log",
    "sequence",
    "replay",
    "session",
    "prompt",
    "system",
    "answer",
    "question",
    "latency",
]


@dataclass
class Workload:
    """Sessions as their system prompt and user turns; fixed by the seed."""

    systems: list[str]
    sessions: list[tuple[int, list[str]]]


def workload(
    seed: int, n_systems: int, n_sessions: int, turns: int, system_words: int, user_words: int
) -> Workload:
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    systems = [f"System prompt {i}: {text(system_words)}" for i in range(n_systems)]
    sessions = [
        (rng.randrange(n_systems), [f"Q{s}.{t}: {text(user_words)}" for t in range(turns)])
        for s in range(n_sessions)
    ]
    return Workload(systems, sessions)


@dataclass
class Phase:
    """One policy's run."""

    policy: str
    ttft_ms: list[float] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)  # in the order they were sent
    hit_rate: float = 0.0
    failed: int = 0


async def _turn(session: aiohttp.ClientSession, url: str, body: dict[str, Any], phase: Phase) -> str:
    phase.prompts.append(body)
    t0 = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    async with session.post(url, json={**body, "stream": True}) as r:
        if r.status != 200:
            phase.failed += 1
            await r.read()
            return ""
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter()
                    text.append(piece)
    if first is not None:
        phase.ttft_ms.append((first - t0) * 1000)
    return "".join(text)


async def _session(
    http: aiohttp.ClientSession, url: str, w: Workload, idx: int, phase: Phase, think: float, max_tokens: int
) -> None:
    sys_i, users = w.sessions[idx]
    messages: list[dict[str, str]] = [{"role": "system", "content": w.systems[sys_i]}]
    for user in users:
        messages.append({"role": "user", "content": user})
        body = {
            "model": "motor-sim",
            "messages": list(messages),
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        answer = await _turn(http, url, body, phase)
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(think)


async def _engine_hits(h: Harness) -> tuple[float, float]:
    hits = queries = 0.0
    async with aiohttp.ClientSession() as s:
        for node in h.state.nodes.values():
            if node.reg is None:
                continue
            for ep in node.reg.endpoints:
                async with s.get(f"http://{ep.ip}:{ep.business_port}/metrics") as r:
                    text = await r.text()
                hits += samples_sum(text, "vllm:prefix_cache_hits_total")
                queries += samples_sum(text, "vllm:prefix_cache_queries_total")
    return hits, queries


async def run_phase(policy: str, w: Workload, args: argparse.Namespace, root: Path) -> Phase:
    events = {
        "kv_events_config": {"enable_kv_cache_events": True},
        "num_blocks": args.num_blocks,
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
    }
    cfg = cluster_config(
        union={"instances": args.engines, "engine_config": events},
        prefill={"instances": 0},
        decode={"instances": 0},
        coordinator={"policy": {"union": policy}},
    )
    phase = Phase(policy)
    async with running_cluster(
        root / policy,
        cfg,
        nodes=args.engines,
        coordinators=args.coordinators,
        standby=False,
        ready=f"{args.engines} ACTIVE union instances",
        ready_pred=lambda s: (
            sum(1 for i in s.instances.values() if i.state == InstanceState.ACTIVE) >= args.engines
        ),
    ) as h:
        await asyncio.sleep(1.0)  # every node agent following its engine's events
        url = h.base_url + "/chat/completions"
        order = list(range(len(w.sessions)))
        sem = asyncio.Semaphore(args.concurrency)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:

            async def one(i: int) -> None:
                async with sem:
                    await _session(http, url, w, i, phase, args.think, args.max_tokens)

            t0 = time.monotonic()
            await asyncio.gather(*(one(i) for i in order))
            elapsed = time.monotonic() - t0
        hits, queries = await _engine_hits(h)
        phase.hit_rate = hits / queries if queries else 0.0
        print(
            f"  {policy:16s} hit_rate={phase.hit_rate:.3f} ttft p50={_pct(phase.ttft_ms, 50):.1f} ms "
            f"p99={_pct(phase.ttft_ms, 99):.1f} ms, {len(phase.ttft_ms)} requests in {elapsed:.1f}s, "
            f"{phase.failed} failed",
            flush=True,
        )
    return phase


def oracle_hit_rate(prompts: list[dict[str, Any]]) -> float:
    """Cached tokens with one infinite shared cache, over prompt tokens (the engine's rules)."""
    seen: set[int] = set()
    hit = total = 0
    for body in prompts:
        ids = builtin_prompt_ids(body) or []
        chains = prompt_chain(ids, BLOCK)
        n = 0
        while n < len(chains) and chains[n] in seen:
            n += 1
        cached = n * BLOCK
        while cached >= len(ids) and cached > 0:
            cached -= BLOCK
        hit += cached
        total += len(ids)
        seen.update(chains)
    return hit / total if total else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, int(q) - 1))]


async def run(args: argparse.Namespace) -> dict[str, Phase]:
    w = workload(args.seed, args.systems, args.sessions, args.turns, args.system_words, args.user_words)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="motor-bench-kv-"))
    print(
        f"{args.sessions} sessions x {args.turns} turns, {args.systems} shared system prompts, "
        f"{args.engines} builtin engines ({args.num_blocks} blocks of {BLOCK}), {args.coordinators} coordinators, "
        f"concurrency {args.concurrency}",
        flush=True,
    )
    return {p: await run_phase(p, w, args, root) for p in args.policies}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="just bench kv", description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument(
        "--coordinators", type=int, default=2, help="replicas on one port (connections land on either)"
    )
    p.add_argument("--sessions", type=int, default=42)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--systems", type=int, default=2, help="shared system prompts")
    p.add_argument("--system-words", type=int, default=1200, help="~1,200 tokens, ~9 KB of JSON")
    p.add_argument("--user-words", type=int, default=150, help="words a user turn adds")
    p.add_argument(
        "--concurrency",
        type=int,
        default=14,
        help="sessions at once (not a multiple of --engines: see above)",
    )
    p.add_argument("--think", type=float, default=0.3, help="seconds between a session's turns")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=5000.0,
        help="the engines' uncached prompt tokens a second",
    )
    p.add_argument("--num-blocks", type=int, default=1024, help="KV blocks per engine")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--root", help="keep the clusters' files and logs here (default: a temporary dir)")
    args = p.parse_args(argv)
    phases = asyncio.run(run(args))
    kv = phases.get("kv_aware") or next(iter(phases.values()))
    oracle = oracle_hit_rate(kv.prompts)

    def p50(name: str) -> str:
        ph = phases.get(name)
        return f"{_pct(ph.ttft_ms, 50):.1f}" if ph is not None else "nan"

    print(f"oracle hit rate {oracle:.3f}; kv_aware ttft p99 {_pct(kv.ttft_ms, 99):.1f} ms")
    print(
        f"BENCH kv hit_rate={kv.hit_rate:.3f} oracle_hit_rate={oracle:.3f} ttft_p50_ms={p50('kv_aware')} "
        f"affinity_ttft_p50_ms={p50('prefix_affinity')} least_load_ttft_p50_ms={p50('least_load')} "
        f"rr_ttft_p50_ms={p50('round_robin')}"
    )
    return 0
