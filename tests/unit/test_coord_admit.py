"""Admission, the same for every client route: each bad request is refused with a status and a
code naming what is wrong, before any engine sees it; what passes is the body as engines get it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from coordinator.metrics import CoordinatorMetrics
from coordinator.proxy.admit import Admission, Refused
from coordinator.proxy.ask import Ask
from coordinator.proxy.routes import ROUTES
from coordinator.ratelimit import RateLimiter
from coordinator.table import RoutingTable
from core.coordconfig import RateLimitConfig
from core.events import Role
from http1.auth import Guard
from http1.request import Request
from tests.unit.coord_events import instance_events

CONN: Any = None  # admission never writes: the pipeline answers


def table() -> RoutingTable:
    t = RoutingTable()
    for seq, ev in enumerate(instance_events(1, Role.UNION), 1):
        t.apply(ev, seq)
    return t


def request(
    path: bytes, body: Any, *, method: bytes = b"POST", headers: dict[bytes, bytes] | None = None
) -> Request:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return Request(method, path, headers or {}, raw, True, False)


def admission(**kw: Any) -> Admission:
    return Admission(table(), Guard([], []), continue_whole_from=32, **kw)


CHAT = b"/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        (CHAT, b"{nope", 400, "invalid_json"),
        (CHAT, [1, 2], 400, "invalid_json"),
        (CHAT, {"model": 7, "messages": MSGS}, 400, "invalid_model"),
        (CHAT, {"model": "other", "messages": MSGS}, 404, "model_not_found"),
        (CHAT, {"messages": MSGS, "stream": "yes"}, 400, "invalid_stream"),
        (CHAT, {"messages": MSGS, "max_tokens": 0}, 400, "invalid_max_tokens"),
        (CHAT, {"messages": MSGS, "max_completion_tokens": True}, 400, "invalid_max_tokens"),
        (CHAT, {"messages": MSGS, "max_tokens": 10**6}, 400, "invalid_max_tokens"),  # over max_seq_len
        (b"/v1/messages", {"model": "motor-sim", "max_tokens": 5, "messages": "hi"}, 400, "invalid_field"),
        # The native routes pass the same checks: one admission for every route.
        (b"/generate", b"[", 400, "invalid_json"),
        (b"/tokenize", {"model": "other", "prompt": "x"}, 404, "model_not_found"),
        (b"/generate", {"text": "x", "stream": 1}, 400, "invalid_stream"),
    ],
)
def test_bad_bodies_are_refused_naming_what_is_wrong(path: bytes, body: Any, status: int, code: str) -> None:
    got = admission().admit(CONN, request(path, body), ROUTES[path])
    assert isinstance(got, Refused), got
    assert (got.status, got.code) == (status, code), got.message
    assert got.message


def test_reserved_fields_never_reach_an_engine_and_untouched_bytes_pass_as_sent() -> None:
    adm = admission()
    body = {"model": "motor-sim", "messages": MSGS, "max_tokens": 4, "rid": "mine", "kv_transfer_params": {}}
    got = adm.admit(CONN, request(CHAT, body), ROUTES[CHAT])
    assert isinstance(got, Ask)
    assert "rid" not in got.body and "kv_transfer_params" not in orjson.loads(got.raw)
    clean = orjson.dumps({"model": "motor-sim", "messages": MSGS, "max_tokens": 4})
    req = request(CHAT, clean)
    kept = adm.admit(CONN, req, ROUTES[CHAT])
    assert isinstance(kept, Ask) and kept.raw is req.body and not kept.fold
    assert req.rid == kept.root and kept.request_id(2) == f"{kept.root}#a2"


def test_a_long_whole_answer_is_asked_as_a_stream_and_a_short_one_is_not() -> None:
    metrics = CoordinatorMetrics()
    adm = admission(metrics=metrics)
    long = adm.admit(CONN, request(CHAT, {"messages": MSGS}), ROUTES[CHAT])
    assert isinstance(long, Ask) and long.fold and long.body["stream"] is True and not long.stream
    short = adm.admit(CONN, request(CHAT, {"messages": MSGS, "max_tokens": 4}), ROUTES[CHAT])
    assert isinstance(short, Ask) and not short.fold
    native = adm.admit(CONN, request(b"/generate", {"text": "x"}), ROUTES[b"/generate"])
    assert isinstance(native, Ask) and not native.fold  # a native body is never folded
    assert metrics.whole_folded._value.get() == 1


def test_the_gate_refuses_keys_methods_sizes_and_rates_in_that_order() -> None:
    metrics = CoordinatorMetrics()
    limiter = RateLimiter(RateLimitConfig(requests_per_second=1, burst=1), clock=lambda: 0.0)
    adm = Admission(table(), Guard(["k"], []), limiter=limiter, metrics=metrics)
    key = {b"authorization": b"Bearer k"}

    def gate(
        method: bytes = b"POST", headers: dict[bytes, bytes] | None = None, large: bool = False
    ) -> Refused | None:
        req = Request(method, b"/tokenize", headers if headers is not None else key, b"{}", True, large)
        return adm.gate(req, 100)

    assert (r := gate(b"GET", {})) is not None and r.status == 401  # the key before anything else
    assert (r := gate(b"GET")) is not None and (r.status, r.code) == (405, "method_not_allowed")
    assert (r := gate(large=True)) is not None and (r.status, r.code) == (413, "body_too_large")
    assert gate() is None  # admitted: holds the one slot of the burst until released
    limiter.release()
    r = gate()
    assert r is not None and (r.status, r.code) == (429, "rate_limit_exceeded")
    assert r.headers == [(b"retry-after", b"1")]
    assert metrics.rate_limited.labels(reason="rate")._value.get() == 1
