"""One parsed HTTP/1.1 request as the server core hands it to a handler."""

from __future__ import annotations

from http1.auth import normalize_path


class Request:
    """One parsed request; header names are lower-case bytes.

    `raw_path` is the request target's path as sent. `path` is the same percent-decoded and
    normalised (`http1.auth`) on a server that checks keys by path (the coordinator: every
    check and every route sees it); on one that matches paths as sent (an engine) it is
    `raw_path`.
    """

    __slots__ = (
        "body",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_path",
        "rid",
        "too_large",
        "url",
    )

    def __init__(
        self,
        method: bytes,
        url: bytes,
        headers: dict[bytes, bytes],
        body: bytes,
        keep_alive: bool,
        too_large: bool,
        normalize: bool = True,
    ) -> None:
        self.method = method
        self.url = url
        q = url.find(b"?")
        self.raw_path = url if q < 0 else url[:q]
        self.path = normal_path(self.raw_path) if normalize else self.raw_path
        self.query = b"" if q < 0 else url[q + 1 :]
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.too_large = too_large
        self.rid: str | None = None  # the request id the handler gave it, for log lines

    def header(self, name: bytes) -> str | None:
        """A header value by lower-case name."""
        value = self.headers.get(name)
        return value.decode("latin-1") if value is not None else None

    def query_params(self) -> dict[str, str]:
        """The query string as a dict (last value wins)."""
        from urllib.parse import parse_qsl

        return dict(parse_qsl(self.query.decode("latin-1"), keep_blank_values=True))


def normal_path(raw: bytes) -> bytes:
    """The path as routes and key checks see it: percent-decoded, no dot segments or doubled slashes."""
    # The hot paths are already normal: skip the work for them.
    if b"%" not in raw and b"//" not in raw and b"/." not in raw and raw.startswith(b"/"):
        return raw if len(raw) == 1 or not raw.endswith(b"/") else raw.rstrip(b"/") or b"/"
    return normalize_path(raw.decode("latin-1")).encode("latin-1", "replace")
