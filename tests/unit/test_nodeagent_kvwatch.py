"""The node agent's KV event follower: sequence order, gaps, duplicates, malformed frames."""

from __future__ import annotations

import zmq.asyncio

from core.kvblocks import prompt_chain
from core.kvwire import BlockStored, KvBatch, encode_payload, encode_seq
from nodeagent.kvaddr import KvAddrs
from nodeagent.kvwatch import KvFollower
from nodeagent.metrics import AgentMetrics

TOKENS = tuple(range(8))
B0 = KvBatch(0, 0.0, (BlockStored((1,), None, TOKENS[:4], 4),))
B1 = KvBatch(1, 0.0, (BlockStored((2,), 1, TOKENS[4:], 4),))


class Replayed(KvFollower):
    """A follower whose replay socket holds `buffer` (no sockets)."""

    def __init__(self, buffer: list[KvBatch]) -> None:
        super().__init__(
            "n1.0",
            KvAddrs({}, "ipc:///none", "ipc:///none"),
            _put,
            AgentMetrics("n1"),
            zmq.asyncio.Context.instance(),
        )
        self.buffer = buffer
        self.asked: list[int] = []

    async def replay(self, start: int) -> bool:
        self.asked.append(start)
        for b in self.buffer:
            if b.seq >= start:
                self.take(b)
        return True


async def _put(key: str, value: bytes) -> None:
    return None


def frames(b: KvBatch) -> list[bytes]:
    return [b"", encode_seq(b.seq), encode_payload(b.ts, b.events)]


async def test_a_skipped_sequence_is_fetched_from_the_replay_socket() -> None:
    f = Replayed([B0, B1])
    f.expected = 0  # an engine that had published nothing when we started
    await f.on_frames(frames(B1))  # B0 never came on PUB
    assert f.asked == [0] and f.gaps_recovered == 1
    assert f.blocks.chains() == prompt_chain(TOKENS, 4)


async def test_a_gap_the_buffer_no_longer_holds_is_counted_lost() -> None:
    f = Replayed([])
    f.expected = 0
    await f.on_frames(frames(B1))
    assert f.gaps_lost == 1 and f.blocks.orphans == 1  # its parent is unknown: not named


async def test_duplicates_from_a_replay_overlap_are_dropped() -> None:
    f = Replayed([])
    f.take(B0)
    f.take(B1)
    v = f.blocks.version
    f.take(B0)
    assert f.blocks.version == v and f.expected == 2


async def test_malformed_frames_are_counted_and_skipped() -> None:
    f = Replayed([])
    for bad in ([b""], [b"", b"\x01", b""], [b"", encode_seq(0), b"\xc1"]):
        await f.on_frames(bad)
    await f.on_frames(frames(B0))
    assert f.malformed == 3 and len(f.blocks) == 1 and f.expected == 1
