"""Reading one request head within the limits: request line, header bytes and field count.

httptools (llhttp) has no limits of its own and keeps a header value whole until it ends, so
a byte budget is enforced on what is fed to it while a head is being read, and exact counts
on what it hands back. Repeated header names are merged once, at the end of the head (a
merge per repetition is quadratic in their number).
"""

from __future__ import annotations

from typing import Any

import httptools

from core.coordconfig import HttpLimitsConfig


class LimitExceeded(Exception):
    """A request broke a limit: answered with `status` and the connection closed."""

    def __init__(
        self, status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers  # added to the answer (`www-authenticate` on a 401)


def head_budget(limits: HttpLimitsConfig) -> int:
    """Bytes a whole head may take: the request line, the headers and their separators."""
    return limits.max_request_line + limits.max_header_bytes + 4 * limits.max_header_fields + 4


class HeadReader:
    """One connection's request heads: parser callbacks in, a header dict out, limits enforced."""

    __slots__ = ("_fields", "_size", "budget", "fed", "in_head", "limits", "since", "url")

    def __init__(self, limits: HttpLimitsConfig) -> None:
        self.limits = limits
        self.budget = head_budget(limits)
        self.url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._size = 0
        self.in_head = True  # the next bytes belong to a head
        self.fed = 0  # bytes fed while in the current head
        self.since: float | None = None  # when the current head started (header timeout)

    def begin(self, now: float) -> None:
        """A new message starts (its first byte arrived)."""
        self.url = b""
        self._fields = []
        self._size = 0
        self.in_head = True
        if self.since is None:
            self.since = now

    def on_url(self, piece: bytes) -> None:
        """A piece of the request target."""
        self.url += piece
        if len(self.url) > self.limits.max_request_line:
            raise LimitExceeded(
                414, f"request line over the limit of {self.limits.max_request_line} bytes", "uri_too_long"
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        """One complete header field."""
        self._size += len(name) + len(value) + 4
        if len(self._fields) >= self.limits.max_header_fields:
            raise LimitExceeded(
                431, f"more than {self.limits.max_header_fields} header fields", "header_fields_too_many"
            )
        if self._size > self.limits.max_header_bytes:
            raise LimitExceeded(
                431, f"headers over the limit of {self.limits.max_header_bytes} bytes", "headers_too_large"
            )
        self._fields.append((name.lower(), value))

    def complete(self) -> dict[bytes, bytes]:
        """The head ended: its headers (repeated names joined with ', '), timers disarmed."""
        self.in_head = False
        self.since = None
        self.fed = 0
        headers: dict[bytes, bytes] = {}
        repeated = False
        for name, value in self._fields:
            if name in headers:
                repeated = True
                break
            headers[name] = value
        if repeated:
            groups: dict[bytes, list[bytes]] = {}
            for name, value in self._fields:
                groups.setdefault(name, []).append(value)
            headers = {name: b", ".join(values) for name, values in groups.items()}
        self._fields = []
        return headers

    def message_done(self) -> None:
        """The message (body included) ended: what comes next is the next head."""
        self.in_head = True
        self.fed = 0

    def feed(self, parser: Any, data: bytes) -> None:
        """Feed `data` to `parser`, raising `LimitExceeded` past the head budget or a limit."""
        if self.in_head:
            room = self.budget - self.fed
            if len(data) > room:
                # Feed up to the budget: the head may end inside it, else it is too large.
                self.fed = self.budget
                _feed(parser, data[:room])
                if self.in_head:
                    raise LimitExceeded(
                        431, f"request head over the limit of {self.budget} bytes", "headers_too_large"
                    )
                data = data[room:]
            else:
                self.fed += len(data)
        _feed(parser, data)


def _feed(parser: Any, data: bytes) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserCallbackError as exc:
        # httptools wraps what a callback raised; a broken limit is ours to answer.
        if isinstance(exc.__context__, LimitExceeded):
            raise exc.__context__ from None
        raise
