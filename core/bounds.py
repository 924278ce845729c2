"""The bounds of every number an event may carry, and why each is what it is.

`core.eventdata` and `core.events` type their fields with these. pydantic checks them when an
event is decoded, so a value out of bounds makes its event undecodable: a fold skips it as
poison and counts it (`streams.poison`), and no reducer, decision, routing table or encoder
ever sees it. Anyone with a node's credentials may publish that node's registration,
heartbeats and command answers: the bounds are what such a client cannot get past.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

# The largest integer every JSON reader (JavaScript, jq, a spreadsheet) reads exactly.
MAX_SAFE_INT = 2**53 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INT64_MIN = -(2**63)
# vLLM and SGLang index slots, KV blocks and tokens with 32-bit ints: no engine counts more.
MAX_COUNT = 2**31 - 1

# Terms. A leader announces a reign one past the newest term a node says it obeyed (its
# `stale_term` refusal's `seen_term`), and a node's credentials may write any refusal. So a
# node may name at most MAX_SEEN_TERM while reigns may reach MAX_TERM: the worst a hostile
# node can do is move the next reign to 2**52 + 1, which leaves 2**52 - 2 reigns (a new one
# every millisecond for 142,000 years) before the controller stops counting (it then keeps
# announcing MAX_TERM: `controller.leadership.reign_term`). Both are JSON-safe, so the lease
# and the checkpoints, written with a 64-bit encoder, can always hold them.
MAX_TERM = MAX_SAFE_INT
MAX_SEEN_TERM = 2**52
# Motor's own instance ids, for the same reason: assembly takes an id past every id a node
# says it still runs (`node.registered`'s `instance_id`), and a node may say anything.
MAX_INSTANCE_ID = MAX_SAFE_INT
MAX_REPORTED_INSTANCE_ID = 2**52
# 9999-12-31T23:59:59Z: the last second `datetime` (`motor events view`, `motor replay`) shows.
MAX_TIMESTAMP = 253402300799.0
# A refresh entry nests three levels deep; orjson stops at 254, and a checkpoint adds a few.
MAX_JSON_DEPTH = 32

Port = Annotated[int, Field(ge=1, le=65535)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # loads, capacities, counters
Size = Annotated[int, Field(ge=1, le=MAX_COUNT)]  # parallel sizes, nodes of an instance
Rank = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # node ranks, DP ranks
Attempt = Annotated[int, Field(ge=1, le=MAX_COUNT)]
EndpointId = Annotated[int, Field(ge=0, le=UINT32_MAX)]  # seed 001's endpoint ids are uint32
InstanceId = Annotated[int, Field(ge=0, le=MAX_INSTANCE_ID)]  # Motor's own instances
ReportedInstanceId = Annotated[int, Field(ge=0, le=MAX_REPORTED_INSTANCE_ID)]  # what a node says it runs
InstanceRef = Annotated[int, Field(ge=0, le=UINT64_MAX)]  # Motor's or seed 001's (uint64 ids)
Term = Annotated[int, Field(ge=0, le=MAX_TERM)]
SeenTerm = Annotated[int, Field(ge=0, le=MAX_SEEN_TERM)]
# A JetStream sequence: 2**53 messages are 285 years of a million a second.
Seq = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]
Pid = Annotated[int, Field(ge=1, le=2**31 - 1)]  # pid_t is a signed 32-bit int; 0 is no process
# 0..255, or minus the signal that ended the process (Python's `returncode`).
ExitCode = Annotated[int, Field(ge=-255, le=255)]
SchemaVersion = Annotated[int, Field(ge=1, le=MAX_COUNT)]
# NaN or infinity would poison every max() and comparison downstream (and orjson writes them
# as null, so a checkpoint would restore another state than the fold's).
Timestamp = Annotated[float, Field(ge=0.0, le=MAX_TIMESTAMP, allow_inf_nan=False)]  # Unix seconds
Duration = Annotated[float, Field(ge=0.0, le=MAX_TIMESTAMP, allow_inf_nan=False)]  # seconds


def json_safe(value: dict[str, Any]) -> dict[str, Any]:
    """`value` when every encoder here writes it back as it was read; ValueError naming the path."""
    _check(value, "", 0)
    return value


def _check(value: Any, path: str, depth: int) -> None:
    where = path or "the object"
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, str | bool):
        return
    if isinstance(value, int):
        # orjson writes 64-bit integers only (no value is shown: a huge one is slow to print).
        if not INT64_MIN <= value <= UINT64_MAX:
            raise ValueError(f"{where}: an integer outside [-2**63, 2**64 - 1]")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string")
            _check(item, f"{path}.{key}" if path else key, depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1)
    else:
        raise ValueError(f"{where}: a {type(value).__name__} is not a JSON value")


# A JSON object from outside Motor (a refresh body's instance, a ranktable).
JsonObject = Annotated[dict[str, Any], AfterValidator(json_safe)]
