"""A bounded load generator: several concurrent OpenAI SDK clients against the coordinator.

Each client loops over a fixed set of requests (chat and completions, streamed and not,
temperature 0, one model that both the union instance and the P/D pair serve) and records
one `Outcome` per request: status, text, timing of the first byte and of every gap between
stream chunks, and how it failed. At most `clients` requests are in flight and at most
`max_requests` are sent in all. With `retry_connection_errors` a request whose connection
broke is sent again once (what a client does when a coordinator replica dies under it); given
several coordinator URLs (replicas on different hosts), client i starts on URL i and sends its
retry to the next one, as a client behind a load balancer would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import openai

MODEL = "motor-sim"
MAX_TOKENS = 40
FAILURE_PAUSE = 0.2  # seconds a client waits after a failed request


@dataclass(frozen=True, slots=True)
class Spec:
    """One request of the mix."""

    key: str
    api: str  # "chat" | "completions"
    stream: bool
    prompt: str
    max_tokens: int = MAX_TOKENS


PROMPTS = (
    "Tell me about the event log of a control plane",
    "Why does a decode engine need the prefill's KV cache?",
)

SPECS: tuple[Spec, ...] = tuple(
    Spec(f"{api}-{'stream' if stream else 'whole'}-{i}", api, stream, prompt)
    for i, prompt in enumerate(PROMPTS)
    for api in ("chat", "completions")
    for stream in (True, False)
)


@dataclass(slots=True)
class Outcome:
    """What one client saw of one request (times are wall-clock seconds)."""

    spec: str
    client: int
    stream: bool
    started: float
    ended: float = 0.0
    status: int | None = None  # 200, an HTTP error status, or None (connection broke / error event)
    error: str = ""
    text: str = ""
    finished: bool = False  # a finish_reason arrived
    first_byte: float | None = None
    max_gap: float = 0.0  # the longest wait between two stream chunks
    retried: bool = False
    first_error: str = ""
    first_error_connection: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.finished and not self.error

    def failure(self) -> str:
        """A short label of how it failed, for counting."""
        again = " (on the client's retry)" if self.retried else ""
        if self.status not in (200, None):
            return f"HTTP {self.status}: {self.error[:90]}{again}"
        if self.error:
            return self.error[:100] + again
        return "stream ended without a finish_reason" + again

    def describe(self, origin: float = 0.0) -> str:
        kind = "stream" if self.stream else "request"
        return f"{self.spec} ({kind} of client {self.client}, started at {self.started - origin:+.1f} s)"

    def in_flight_at(self, t: float) -> bool:
        return self.started <= t <= (self.ended or float("inf"))


def _client(base_url: str, timeout: float | openai.Timeout = 60.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=timeout)


async def run_one(client: openai.AsyncOpenAI, spec: Spec, out: Outcome) -> None:
    """Send one request and fill `out` (never raises for a failure of the request itself)."""
    common: dict[str, Any] = {"model": MODEL, "max_tokens": spec.max_tokens, "temperature": 0}
    try:
        if spec.api == "chat":
            messages: Any = [{"role": "user", "content": spec.prompt}]
            if spec.stream:
                stream = await client.chat.completions.create(messages=messages, stream=True, **common)
                await _consume(stream, out, lambda c: c.choices[0].delta.content or "")
            else:
                resp = await client.chat.completions.create(messages=messages, **common)
                out.text = resp.choices[0].message.content or ""
                out.finished = resp.choices[0].finish_reason is not None
        elif spec.stream:
            stream = await client.completions.create(prompt=spec.prompt, stream=True, **common)
            await _consume(stream, out, lambda c: c.choices[0].text or "")
        else:
            resp2 = await client.completions.create(prompt=spec.prompt, **common)
            out.text = resp2.choices[0].text or ""
            out.finished = resp2.choices[0].finish_reason is not None
        out.status = 200
    except openai.APIStatusError as exc:
        out.status = exc.status_code
        out.error = _message(exc)
    except openai.APIConnectionError as exc:
        out.status = None
        out.error = f"connection: {type(exc).__name__}: {exc}"
    except openai.APIError as exc:  # an error event inside a stream
        out.status = None
        out.error = f"error in stream: {_message(exc)}"
    except Exception as exc:  # the HTTP library's own error mid-stream: the connection broke
        out.status = None
        out.error = f"connection: {type(exc).__name__}: {exc}"
    finally:
        out.ended = time.time()
        if out.first_byte is None and out.status == 200:
            out.first_byte = out.ended


async def _consume(stream: Any, out: Outcome, piece: Any) -> None:
    last = time.time()
    parts = []
    async for chunk in stream:
        now = time.time()
        if out.first_byte is None:
            out.first_byte = now
        else:
            out.max_gap = max(out.max_gap, now - last)
        last = now
        if not chunk.choices:
            continue
        parts.append(piece(chunk))
        if chunk.choices[0].finish_reason is not None:
            out.finished = True
    out.text = "".join(parts)


def _message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(exc.message or exc)


class LoadGen:
    """`clients` concurrent loops over SPECS until stopped (or `max_requests` were sent)."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        clients: int = 6,
        max_requests: int = 5000,
        retry_connection_errors: bool = False,
        specs: tuple[Spec, ...] = SPECS,
        timeout: float | openai.Timeout = 60.0,
    ) -> None:
        self.base_urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.timeout = timeout
        self.clients = clients
        self.max_requests = max_requests
        self.retry_connection_errors = retry_connection_errors
        self.specs = specs
        self.outcomes: list[Outcome] = []
        self._running: dict[int, Outcome] = {}  # by id(): outcomes are mutable
        self._sent = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def in_flight(self) -> list[Outcome]:
        return list(self._running.values())

    async def __aenter__(self) -> LoadGen:
        self._tasks = [asyncio.create_task(self._loop(i), name=f"load-{i}") for i in range(self.clients)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Let requests in flight finish (bounded), then stop every client."""
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=90)
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._tasks = []

    async def _loop(self, i: int) -> None:
        k = len(self.base_urls)
        # Client i talks to URL i first and to the next one on a retry.
        clients = [_client(self.base_urls[(i + j) % k], self.timeout) for j in range(min(k, 2))]
        n = i
        try:
            while not self._stop.is_set() and self._sent < self.max_requests:
                self._sent += 1
                spec = self.specs[n % len(self.specs)]
                n += 1
                if not await self._request(clients, spec, i):
                    # A client backs off after a failure instead of spinning on fast errors.
                    await asyncio.sleep(FAILURE_PAUSE)
        finally:
            for c in clients:
                await c.close()

    async def _request(self, clients: list[openai.AsyncOpenAI], spec: Spec, i: int) -> bool:
        client = clients[0]
        out = await self._attempt(client, spec, Outcome(spec.key, i, spec.stream, time.time()))
        if self.retry_connection_errors and not out.ok and out.error.startswith("connection"):
            # A client pauses before it retries (the dead replica's socket may take a moment to
            # leave the port); counted from the first attempt: the check asks when it began.
            await asyncio.sleep(FAILURE_PAUSE)
            again = Outcome(spec.key, i, spec.stream, out.started, retried=True, first_error=out.error)
            again.first_error_connection = True
            out = await self._attempt(clients[-1], spec, again)
        self.outcomes.append(out)
        return out.ok

    async def _attempt(self, client: openai.AsyncOpenAI, spec: Spec, out: Outcome) -> Outcome:
        self._running[id(out)] = out
        try:
            await run_one(client, spec, out)
        finally:
            self._running.pop(id(out), None)
        return out


async def reference_texts(base_url: str, specs: tuple[Spec, ...] = SPECS) -> dict[str, str]:
    """The text of each request on an undisturbed cluster (temperature 0: always the same)."""
    client = _client(base_url)
    refs: dict[str, str] = {}
    try:
        for spec in specs:
            out = Outcome(spec.key, -1, spec.stream, time.time())
            await run_one(client, spec, out)
            if not out.ok:
                raise AssertionError(f"reference run of {spec.key} failed: {out.failure()}")
            refs[spec.key] = out.text
    finally:
        await client.close()
    return refs
