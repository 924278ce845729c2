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


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events' `data:` payloads in `buf`, and the unfinished rest."""
    buf = buf.replace(b"\r\n", b"\n")
    out: list[bytes] = []
    while True:
        end = buf.find(b"\n\n")
        if end < 0:
            return out, buf
        block, buf = buf[:end], buf[end + 2 :]
        data = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:
            out.append(b"\n".join(data))


@dataclass(slots=True)
class Progress:
    """What the client got of a stream before it broke."""

    text: str = ""
    tokens: int = 0
    done: bool = False  # the stream had already sent [DONE]
    clean: bool = True  # it ended at an event boundary
    stream_id: str | None = None
    created: int | None = None


def progress_of(decoded: bytes) -> Progress:
    """Recover the text and token count a (chat) completion stream delivered."""
    events, rest = split_events(decoded)
    p = Progress(clean=not rest.strip())
    parts: list[str] = []
    for data in events:
        if data.strip() == DONE:
            p.done = True
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            p.clean = False
            continue
        if not isinstance(obj, dict):
            continue
        if p.stream_id is None and isinstance(obj.get("id"), str):
            p.stream_id = obj["id"]
            p.created = obj.get("created") if isinstance(obj.get("created"), int) else None
        piece = _text_of(obj)
        if piece:
            parts.append(piece)
            p.tokens += 1
    p.text = "".join(parts)
    return p


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
        self.buf = b""
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """Decoded body bytes of the continuation in, SSE bytes for the client out."""
        events, self.buf = split_events(self.buf + data)
        out: list[bytes] = []
        for ev in events:
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
