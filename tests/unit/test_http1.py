"""http1's pure parts: path normalisation, the key check, request heads within limits."""

from __future__ import annotations

import time

import httptools
import pytest

from core.coordconfig import HttpLimitsConfig
from http1.auth import Access, Denial, Guard, Pass, normalize_path, presented_keys
from http1.head import HeadReader, LimitExceeded, head_budget


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1%2Finstances/refresh", "/v1/instances/refresh"),
        ("/v1%2finstances%2frefresh", "/v1/instances/refresh"),
        ("//v1//instances/refresh/", "/v1/instances/refresh"),
        ("/v1/./instances/refresh", "/v1/instances/refresh"),
        ("/v1/x/../instances/refresh", "/v1/instances/refresh"),
        ("/../../etc/passwd", "/etc/passwd"),
        ("/%2E%2E/liveness", "/liveness"),
        ("/v1%252Finstances", "/v1%2Finstances"),  # decoded once, as a router decodes
        ("", "/"),
        ("/", "/"),
    ],
)
def test_normalize_path(raw: str, normal: str) -> None:
    assert normalize_path(raw) == normal


def _headers(**h: str) -> dict[bytes, bytes]:
    return {k.replace("_", "-").encode(): v.encode() for k, v in h.items()}


@pytest.mark.parametrize(
    ("users", "admins", "access", "headers", "want"),
    [
        ((), (), Access.ADMIN, {}, None),  # no key configured: open
        (("u",), ("a",), Access.PUBLIC, {}, None),
        (("u",), ("a",), Access.USER, {}, 401),
        (("u",), ("a",), Access.USER, _headers(authorization="Bearer u"), None),
        (("u",), ("a",), Access.USER, _headers(authorization="bearer   u "), None),
        (("u",), ("a",), Access.USER, _headers(authorization="Basic u"), 401),
        (("u",), ("a",), Access.USER, _headers(authorization="Bearer"), 401),
        (("u",), ("a",), Access.USER, _headers(x_api_key="u"), None),
        (("u",), ("a",), Access.USER, _headers(x_api_key="a"), None),  # admin keys open user routes
        (("u",), ("a",), Access.USER, _headers(x_api_key="uu"), 401),
        (("u",), ("a",), Access.ADMIN, _headers(x_api_key="u"), 403),
        (("u",), ("a",), Access.ADMIN, _headers(authorization="Bearer a"), None),
        (("u",), ("a",), Access.ADMIN, _headers(authorization="Bearer u", x_api_key="a"), None),
        (("u",), (), Access.ADMIN, _headers(x_api_key="u"), 403),  # no admin key: management locked
        ((), ("a",), Access.USER, {}, None),  # only management locked
        ((), ("a",), Access.ADMIN, {}, 401),
    ],
)
def test_guard(
    users: tuple[str, ...],
    admins: tuple[str, ...],
    access: Access,
    headers: dict[bytes, bytes],
    want: int | None,
) -> None:
    denial = Guard(users, admins).check(access, headers.get)
    assert (denial.status if denial else None) == want


@pytest.mark.parametrize(
    ("users", "admins", "access", "headers", "want"),
    [
        ((), (), Access.USER, {}, Pass.OPEN),  # no key anywhere: every client is equal
        (("u",), (), Access.USER, _headers(authorization="Bearer u"), Pass.KEYED),
        (("u",), (), Access.USER, {}, 401),
        (("u",), (), Access.PUBLIC, {}, Pass.ANONYMOUS),  # a probe without a key: not trusted
        (("u",), (), Access.PUBLIC, _headers(x_api_key="u"), Pass.KEYED),
        (("u",), (), Access.PUBLIC, _headers(x_api_key="wrong"), Pass.ANONYMOUS),
        (("u",), ("a",), Access.ADMIN, _headers(x_api_key="a"), Pass.KEYED),
        (("u",), ("a",), Access.ADMIN, _headers(x_api_key="u"), 403),
        ((), ("a",), Access.USER, {}, Pass.OPEN),  # only management locked
        ((), ("a",), Access.PUBLIC, {}, Pass.ANONYMOUS),
    ],
)
def test_judge_is_what_the_head_check_trusts_by(
    users: tuple[str, ...],
    admins: tuple[str, ...],
    access: Access,
    headers: dict[bytes, bytes],
    want: Pass | int,
) -> None:
    guard = Guard(users, admins)
    verdict = guard.judge(access, headers.get)
    assert (verdict.status if isinstance(verdict, Denial) else verdict) == want
    # `check` (the handlers') is the same verdict: refused exactly when judged a Denial.
    assert (guard.check(access, headers.get) is not None) == isinstance(verdict, Denial)


def test_presented_keys_reads_both_headers() -> None:
    got = presented_keys(_headers(authorization="BEARER k1", x_api_key=" k2 ").get)
    assert got == [b"k1", b"k2"]


LIMITS = HttpLimitsConfig(max_request_line=256, max_header_bytes=1024, max_header_fields=8)


class _Conn:
    """The parser callbacks a server forwards to its HeadReader."""

    def __init__(self) -> None:
        self.head = HeadReader(LIMITS)
        self.parser = httptools.HttpRequestParser(self)
        self.heads: list[dict[bytes, bytes]] = []

    def on_message_begin(self) -> None:
        self.head.begin(0.0)

    def on_url(self, url: bytes) -> None:
        self.head.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.on_header(name, value)

    def on_headers_complete(self) -> None:
        self.heads.append(self.head.complete())

    def on_message_complete(self) -> None:
        self.head.message_done()

    def feed(self, data: bytes) -> None:
        self.head.feed(self.parser, data)


def test_repeated_headers_merge_and_pipelined_heads_are_read() -> None:
    c = _Conn()
    req = b"GET /a HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nx-b: 3\r\n\r\n"
    c.feed(req + req)
    assert c.heads == [{b"x-a": b"1, 2", b"x-b": b"3"}] * 2


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(9)) + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nx-big: " + b"b" * 1100 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nx-big: " + b"b" * 10_000, 431),  # never ends: the byte budget
    ],
)
def test_limits(data: bytes, status: int) -> None:
    c = _Conn()
    with pytest.raises(LimitExceeded) as info:
        c.feed(data)
    assert info.value.status == status


def test_the_budget_counts_a_head_fed_byte_by_byte() -> None:
    c = _Conn()
    with pytest.raises(LimitExceeded):
        for b in b"GET / HTTP/1.1\r\nx: " + b"v" * head_budget(LIMITS):
            c.feed(bytes([b]))


def test_a_body_is_not_counted_as_head() -> None:
    c = _Conn()
    body = b"z" * 10_000
    c.feed(b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    c.feed(b"GET / HTTP/1.1\r\n\r\n")
    assert len(c.heads) == 2


def test_ten_thousand_repeated_headers_merge_in_linear_time() -> None:
    big = HttpLimitsConfig(max_header_fields=100_000, max_header_bytes=10_000_000)
    head = HeadReader(big)
    head.begin(0.0)
    t0 = time.perf_counter()
    for _ in range(50_000):
        head.on_header(b"x-same", b"v" * 100)
    merged = head.complete()
    assert len(merged[b"x-same"]) == 50_000 * 102 - 2
    assert time.perf_counter() - t0 < 1.0
