"""Client sinks: an engine's decoded body in, client bytes out, where the proxy cannot pass the
engine's bytes through untouched (Anthropic translation, a continued stream). Not
`streams.sinks`, which deliver log messages to a consumer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from coordinator.anthropic_stream import StreamTranslator
from coordinator.proxy.continuation import Progress, StreamSplicer
from http1 import wire

if TYPE_CHECKING:
    from coordinator.proxy.call import Call


class Sink(ABC):
    """Decoded engine body in, client bytes out (chunk-framed)."""

    def head(self, call: Call) -> bytes | None:
        """The response head to write before the first bytes, or None if already written."""
        return None

    @abstractmethod
    def feed(self, data: bytes) -> bytes:
        """Client bytes for this piece of the engine's body."""

    @abstractmethod
    def end(self) -> bytes:
        """Client bytes that close the response."""


class SpliceSink(Sink):
    """A continued OpenAI stream: events rewritten into the original stream."""

    def __init__(self, p: Progress) -> None:
        self.splicer = StreamSplicer(p)

    def feed(self, data: bytes) -> bytes:
        out = self.splicer.feed(data)
        return wire.chunk(out) if out else b""

    def end(self) -> bytes:
        tail = b"" if self.splicer.done else wire.chunk(b"data: [DONE]\n\n")
        return tail + wire.LAST_CHUNK


class AnthropicSink(Sink):
    """An OpenAI chat stream translated to Anthropic events (continuations spliced first)."""

    def __init__(self, model: str) -> None:
        self.translator = StreamTranslator(model)
        self.splicer: StreamSplicer | None = None
        self.head_sent = False

    def head(self, call: Call) -> bytes | None:
        if self.head_sent:
            return None
        self.head_sent = True
        return wire.build_head(
            200,
            [
                (b"content-type", wire.SSE_CT),
                (b"cache-control", b"no-cache"),
                (b"x-request-id", call.root_b),
            ],
            content_length=None,
            keep_alive=call.req.keep_alive,
        )

    def feed(self, data: bytes) -> bytes:
        if self.splicer is not None:
            data = self.splicer.feed(data)
        out = self.translator.feed_sse(data)
        return wire.chunk(out) if out else b""

    def end(self) -> bytes:
        out = self.translator.finish()
        return (wire.chunk(out) if out else b"") + wire.LAST_CHUNK
