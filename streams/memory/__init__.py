"""The log in memory: a `MemoryServer` holding streams, buckets and durable consumers, and a
`MemoryLog` per client reaching it over a `Link`. See `streams.log` for what it promises and
tests/integration/test_log_contract.py for the cases that hold it to JetStream's behaviour."""

from streams.memory.client import MemoryLog
from streams.memory.link import DirectLink, Link
from streams.memory.server import MemoryServer

__all__ = ["DirectLink", "Link", "MemoryLog", "MemoryServer"]
