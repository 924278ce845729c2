"""Mid-stream continuation, pure: what a dead stream already sent, and how to go on elsewhere.

Nothing here runs on the happy path (`resume.py` is the fault path that uses it). When an
engine dies midway through an SSE stream the proxy has its decoded body; from it we recover
the text and the number of tokens the client already got, build a request that continues
from prompt + that text with the remaining token budget, and rewrite the new stream's events
so the client sees one stream (same id, no second role delta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

DONE = b"[DONE]"


# An SSE event longer than this is no engine's token chunk: dropped whole (and counted) rather
# than buffered without end.
MAX_EVENT = 8 << 20


def _payloads(block: bytes, out: list[bytes]) -> None:
    data = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    if data:
        out.append(b"\n".join(data))


class EventSplitter:
    """The `data:` payloads of SSE events, from a body fed in pieces: every byte is searched once (the unfinished
    event is not scanned again from its start with each piece, which made an event that never
    ends quadratic), and an event past `limit` bytes is dropped whole (`dropped` counts them)
    instead of growing the buffer without end."""

    __slots__ = ("buf", "cr", "dropped", "limit", "skipping")

    def __init__(self, limit: int = MAX_EVENT) -> None:
        self.buf = bytearray()
        self.cr = False  # the last piece ended in "\r": its "\n" may come in the next one
        self.dropped = 0
        self.limit = limit
        self.skipping = False  # inside an event already dropped

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the events this piece completes."""
        if self.cr:
            data = b"\r" + data
            self.cr = False
        if data.endswith(b"\r"):
            data = data[:-1]
            self.cr = True
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        buf = self.buf
        start = max(0, len(buf) - 1)  # the rest holds no event end: search only what is new
        buf += data
        out: list[bytes] = []
        pos = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            if self.skipping:
                self.skipping = False
            else:
                _payloads(bytes(buf[pos:end]), out)
            pos = start = end + 2
        if pos:
            del buf[:pos]
        if len(buf) > self.limit:
            if not self.skipping:
                self.skipping = True
                self.dropped += 1
            del buf[:-1]  # its last byte may be the first half of its end
        return out

    def rest(self) -> bytes:
        """What is buffered of an unfinished event."""
        return bytes(self.buf) + (b"\r" if self.cr else b"")


# Body fields a continuation cannot honour: the grammar, tool parser or logprobs of the second
# half would start again at the cut (a folded whole answer asking for one keeps the plain whole
# path, a stream is ended with an error event instead of continued).
REFUSED = (
    "tools",
    "functions",
    "tool_choice",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "suffix",
    "continue_final_message",
)


def refused_by(body: dict[str, Any]) -> str | None:
    """The field of `body` a continuation cannot honour, if any (None: it can be continued)."""
    for key in REFUSED:
        if body.get(key):
            return key
    if body.get("n") not in (None, 1):
        return "n"
    if body.get("best_of") not in (None, 1):
        return "best_of"
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return "response_format"
    return None


@dataclass(slots=True)
class Progress:
    """What the client got of a stream before it broke."""

    text: str = ""
    tokens: int = 0
    done: bool = False  # the stream had already sent [DONE]
    clean: bool = True  # it ended at an event boundary
    stream_id: str | None = None
    created: int | None = None
    # What the client got that a continuation prompt cannot carry (it carries content only):
    # "reasoning" or "tool calls" once a delta held them, else None.
    beyond_text: str | None = None


def progress_of(decoded: bytes) -> Progress:
    """Recover the text and token count a (chat) completion stream delivered."""
    f = ProgressFold()
    f.feed(decoded)
    return f.result()


class ProgressFold:
    """`progress_of` folded as a body arrives: a long stream keeps the text it delivered, not
    its whole body (the SSE framing of a token is ~20 times its text)."""

    __slots__ = ("beyond", "events", "p", "parts")

    def __init__(self) -> None:
        self.events = EventSplitter()
        self.p = Progress()
        self.parts: list[str] = []
        self.beyond: str | None = None

    def feed(self, data: bytes) -> None:
        p = self.p
        for data_ in self.events.feed(data):
            if data_.strip() == DONE:
                p.done = True
                continue
            try:
                obj = orjson.loads(data_)
            except orjson.JSONDecodeError:
                p.clean = False
                continue
            if not isinstance(obj, dict):
                continue
            if p.stream_id is None and isinstance(obj.get("id"), str):
                p.stream_id = obj["id"]
                p.created = obj.get("created") if isinstance(obj.get("created"), int) else None
            if self.beyond is None:
                self.beyond = _beyond_text(obj)
            piece = _text_of(obj)
            if piece:
                self.parts.append(piece)
                p.tokens += 1

    def result(self) -> Progress:
        """What was delivered so far (a new `Progress`; the fold may go on)."""
        p = self.p
        ev = self.events
        return Progress(
            text="".join(self.parts),
            tokens=p.tokens,
            done=p.done,
            clean=p.clean and not ev.skipping and not ev.dropped and not ev.rest().strip(),
            stream_id=p.stream_id,
            created=p.created,
            beyond_text=self.beyond,
        )


def _text_of(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    delta = c.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        return content if isinstance(content, str) else ""
    text = c.get("text")
    return text if isinstance(text, str) else ""


def _beyond_text(obj: dict[str, Any]) -> str | None:
    """What a chunk delivered besides text that a continuation cannot carry on."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return None
    for c in choices:
        delta = c.get("delta") if isinstance(c, dict) else None
        if not isinstance(delta, dict):
            continue
        if delta.get("tool_calls") or delta.get("function_call"):
            return "tool calls"
        if delta.get("reasoning_content") or delta.get("reasoning"):
            return "reasoning"
    return None


def not_continuable(body: dict[str, Any], p: Progress) -> str | None:
    """Why a broken stream of `body` that delivered `p` cannot be continued elsewhere without
    the client seeing a seam (None: it can)."""
    field = refused_by(body)
    if field is not None:
        return f"a request with {field!r} cannot be continued on another engine (it would start again at the cut)"
    if p.beyond_text is not None:
        return f"it had streamed {p.beyond_text}, which a continuation cannot carry on"
    return None


def continuation_body(path: bytes, body: dict[str, Any], p: Progress) -> dict[str, Any] | None:
    """A request continuing `body` after what `p` delivered; None when it cannot be continued."""
    n = body.get("n")
    if n not in (None, 1):
        return None
    out = dict(body)
    for key in ("max_tokens", "max_completion_tokens"):
        limit = body.get(key)
        if isinstance(limit, int):
            left = limit - p.tokens
            if left <= 0:
                return None
            out[key] = left
    if path.endswith(b"/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        out["messages"] = [*messages, {"role": "assistant", "content": p.text}]
        # vLLM/SGLang: render the partial assistant turn open so generation goes on in it.
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        out["prompt"] = prompt + p.text
    out.pop("min_tokens", None)
    return out


class StreamSplicer:
    """Rewrites a continuation stream's events into the broken stream (plain SSE out)."""

    def __init__(self, p: Progress) -> None:
        self.p = p
        self.events = EventSplitter()
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """Decoded body bytes of the continuation in, SSE bytes for the client out."""
        out: list[bytes] = []
        for ev in self.events.feed(data):
            if ev.strip() == DONE:
                self.done = True
                out.append(b"data: [DONE]\n\n")
                continue
            try:
                obj = orjson.loads(ev)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            if self._role_only(obj):
                continue
            if self.p.stream_id is not None:
                obj["id"] = self.p.stream_id
            if self.p.created is not None:
                obj["created"] = self.p.created
            out.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        return b"".join(out)

    @staticmethod
    def _role_only(obj: dict[str, Any]) -> bool:
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return False
        c = choices[0]
        delta = c.get("delta")
        return (
            isinstance(delta, dict)
            and not delta.get("content")
            and "role" in delta
            and c.get("finish_reason") is None
        )
