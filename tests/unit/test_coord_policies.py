"""Scheduling policies: one interface, a registry, and each policy's promise."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from coordinator.policies import REGISTRY, PrefixAffinity, RequestInfo, make_policy, prompt_prefix
from coordinator.policies.power_of_two import PowerOfTwo
from coordinator.policies.prefix_affinity import block_hashes
from coordinator.table import Endpoint
from core.events import Role


def eps(*loads: int) -> list[Endpoint]:
    return [
        Endpoint(
            key=f"e{i}",
            instance_id=i,
            role=Role.UNION,
            engine_type="builtin",
            model="m",
            host="127.0.0.1",
            port=9000 + i,
            bootstrap_port=None,
            capabilities=frozenset(),
            group=i,
            running=load,
        )
        for i, load in enumerate(loads)
    ]


def req(prefix: bytes = b"", rid: str = "r") -> RequestInfo:
    return RequestInfo(model="m", prefix=prefix, request_id=rid)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_honours_the_interface(name: str) -> None:
    policy = make_policy(name)
    assert policy.name == name
    assert policy.select([], req()) is None
    endpoints = eps(0, 0, 0)
    assert policy.select(endpoints, req(), exclude={"e0", "e1", "e2"}) is None
    for _ in range(20):
        chosen = policy.select(endpoints, req(b"x" * 300), exclude={"e1"})
        assert chosen is not None and chosen.key != "e1"


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="least_load"):
        make_policy("fastest")


def test_round_robin_rotates() -> None:
    p = make_policy("round_robin")
    endpoints = eps(5, 0, 9)
    assert [p.select(endpoints, req()).key for _ in range(6)] == ["e0", "e1", "e2", "e0", "e1", "e2"]  # type: ignore[union-attr]


def test_least_load_counts_running_waiting_and_inflight() -> None:
    p = make_policy("least_load")
    endpoints = eps(2, 1, 3)
    assert p.select(endpoints, req()).key == "e1"  # type: ignore[union-attr]
    endpoints[1].waiting = 2
    assert p.select(endpoints, req()).key == "e0"  # type: ignore[union-attr]
    endpoints[0].inflight = 5  # e0: 7, e1: 3, e2: 3 + 1
    endpoints[2].inflight = 1
    assert p.select(endpoints, req()).key == "e1"  # type: ignore[union-attr]


def test_least_load_spreads_ties() -> None:
    p = make_policy("least_load")
    endpoints = eps(0, 0, 0, 7)
    seen = Counter(p.select(endpoints, req()).key for _ in range(30))  # type: ignore[union-attr]
    assert set(seen) == {"e0", "e1", "e2"}


def test_power_of_two_never_picks_the_worse_of_its_pair() -> None:
    p = PowerOfTwo(random.Random(7))
    endpoints = eps(0, 100)
    assert all(p.select(endpoints, req()).key == "e0" for _ in range(50))  # type: ignore[union-attr]
    spread = Counter(p.select(eps(1, 1, 1, 1), req()).key for _ in range(400))  # type: ignore[union-attr]
    assert len(spread) == 4


def test_block_hashes_name_whole_prefixes_at_doubling_boundaries() -> None:
    a = block_hashes(b"A" * 10 + b"B" * 10, 10, 100)
    b = block_hashes(b"C" * 10 + b"B" * 10, 10, 100)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]
    # Boundaries double: 10, 20, 40, 80, then the cap at 100.
    assert [h >> 48 for h in block_hashes(b"x" * 1000, 10, 100)] == [10, 20, 40, 80, 100]
    assert block_hashes(b"x" * 1000, 10, 100) == block_hashes(b"x" * 100, 10, 100)  # capped
    assert [h >> 48 for h in block_hashes(b"xyz", 10, 100)] == [3]  # a short prompt still has a block
    assert block_hashes(b"xyz", 10, 100) != block_hashes(b"xyzw", 10, 100)
    assert block_hashes(b"", 10, 100) == []


def test_prefix_affinity_sticks_to_the_endpoint_holding_the_prefix() -> None:
    p = PrefixAffinity(first_block=16)
    endpoints = eps(0, 0, 0, 0)
    system = b"You are a helpful assistant. " * 4
    first = p.select(endpoints, req(system + b"question one"))
    assert first is not None
    for q in (b"question two", b"another", b"and a third"):
        assert p.select(endpoints, req(system + q)) is first
    assert p.hits == 3


def test_prefix_affinity_prefers_the_longest_remembered_prefix() -> None:
    p = PrefixAffinity(first_block=4)
    endpoints = eps(0, 0)
    short = p.select(endpoints, req(b"aaaa"), exclude={"e1"})
    long_ = p.select(endpoints, req(b"aaaabbbbcccc"), exclude={"e0"})
    assert (short.key, long_.key) == ("e0", "e1")  # type: ignore[union-attr]
    # The longer match (e1) wins over the shorter one (e0) for a prompt extending both.
    assert p.select(endpoints, req(b"aaaabbbbccccdddd")).key == "e1"  # type: ignore[union-attr]


def test_prefix_affinity_load_bound_spills_a_hot_prefix() -> None:
    p = PrefixAffinity(first_block=8, load_factor=1.25, slack=0)
    endpoints = eps(0, 0, 0, 0)
    hot = b"the same hot prompt prefix"
    home = p.select(endpoints, req(hot))
    assert home is not None
    picks: Counter[str] = Counter()
    for _ in range(40):
        chosen = p.select(endpoints, req(hot))
        assert chosen is not None
        chosen.inflight += 1  # the requests stay in flight: load accumulates
        picks[chosen.key] += 1
    # Bounded loads: nobody exceeds ceil(1.25 × mean + 1) while the prefix is hot.
    assert max(e.load for e in endpoints) <= 1.25 * (40 + 1) / 4 + 1
    assert len(picks) == 4


def test_prefix_affinity_memory_is_bounded_lru() -> None:
    p = PrefixAffinity(first_block=4, max_bytes=8, capacity=10)
    endpoints = eps(0, 0)
    for i in range(100):
        p.select(endpoints, req(f"{i:08d}".encode()))
    assert len(p) == 10


def test_prompt_prefix_reads_messages_prompt_or_input() -> None:
    assert prompt_prefix({"prompt": "hello"}) == b"hello"
    assert (
        prompt_prefix({"messages": [{"role": "user", "content": "hi"}]})
        == b'[{"role":"user","content":"hi"}]'
    )
    assert prompt_prefix({"input": ["a", "b"]}) == b'["a","b"]'
    assert prompt_prefix({}) == b""
    assert len(prompt_prefix({"prompt": "x" * 100000})) == 8192


def test_only_prefix_affinity_needs_the_prefix() -> None:
    assert {name for name in REGISTRY if make_policy(name).uses_prefix} == {"prefix_affinity"}


def test_prefix_affinity_hit_keeps_the_match_fresh_in_the_lru() -> None:
    p = PrefixAffinity(first_block=4, max_bytes=16, capacity=8)
    endpoints = eps(0, 0)
    home = p.select(endpoints, req(b"aaaabbbb"))
    for i in range(20):
        p.select(endpoints, req(f"{i:04d}zzzz".encode()))  # churn ...
        assert p.select(endpoints, req(b"aaaabbbb")) is home  # ... the hot prefix survives it
