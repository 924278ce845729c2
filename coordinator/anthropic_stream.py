"""OpenAI chat SSE chunks → Anthropic stream events (message_start … message_stop).

Fed chunk by chunk (dicts, or raw SSE bytes split anywhere), it returns the Anthropic SSE
bytes to send for each. `message_delta` waits for the end of the stream because the usage
chunk (`stream_options.include_usage`) arrives after the chunk carrying `finish_reason`.
"""

from __future__ import annotations

from typing import Any

import orjson

from core.http_errors import anthropic_sse_error, message_of

_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def map_stop_reason(finish_reason: str | None, matched: Any = None) -> tuple[str | None, str | None]:
    """Anthropic (stop_reason, stop_sequence) for an OpenAI finish_reason (and vLLM's matched stop)."""
    if finish_reason is None:
        return None, None
    if finish_reason == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return _FINISH.get(finish_reason, "end_turn"), None


def sse_event(name: str, payload: dict[str, Any]) -> bytes:
    """One Anthropic SSE event."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class StreamTranslator:
    """Translate one chat completion stream into one Anthropic message stream."""

    def __init__(self, model: str, message_id: str | None = None, input_tokens: int = 0) -> None:
        self.model = model
        self.message_id = message_id
        self.input_tokens = input_tokens
        self.output_tokens = 0
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.text = ""  # everything streamed as text so far
        self._started = False
        self._finished = False
        self._index = -1  # index of the open content block, -1 when none
        self._open: str | None = None  # "text" | "tool_use"
        self._tool_blocks: dict[int, int] = {}  # OpenAI tool-call index → content block index
        self._buf = b""

    @property
    def finished(self) -> bool:
        """Whether message_stop has been produced."""
        return self._finished

    def _start(self, chunk: dict[str, Any] | None) -> bytes:
        self._started = True
        if self.message_id is None:
            cid = (chunk or {}).get("id") or "motor"
            self.message_id = "msg_" + str(cid).removeprefix("chatcmpl-")
        usage = (chunk or {}).get("usage") or {}
        if usage.get("prompt_tokens"):
            self.input_tokens = int(usage["prompt_tokens"])
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return sse_event("message_start", {"type": "message_start", "message": message}) + sse_event(
            "ping", {"type": "ping"}
        )

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._index += 1
        self._open = kind
        return out + sse_event(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Translate one chat.completion.chunk; returns the Anthropic events it produces."""
        if self._finished:
            return b""
        out = b"" if self._started else self._start(chunk)
        usage = chunk.get("usage")
        if usage:
            self.output_tokens = int(usage.get("completion_tokens") or self.output_tokens)
            if usage.get("prompt_tokens"):
                self.input_tokens = int(usage["prompt_tokens"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self._open != "text":
                    out += self._open_block("text", {"type": "text", "text": ""})
                self.text += text
                out += sse_event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._index,
                        "delta": {"type": "text_delta", "text": text},
                    },
                )
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
            if choice.get("finish_reason") is not None:
                self.stop_reason, self.stop_sequence = map_stop_reason(
                    choice["finish_reason"], choice.get("stop_reason")
                )
        return out

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        out = b""
        idx = int(call.get("index", 0))
        fn = call.get("function") or {}
        if idx not in self._tool_blocks:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{idx}",
                "name": fn.get("name") or "",
                "input": {},
            }
            out += self._open_block("tool_use", block)
            self._tool_blocks[idx] = self._index
        args = fn.get("arguments")
        if args:
            out += sse_event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._tool_blocks[idx],
                    "delta": {"type": "input_json_delta", "partial_json": args},
                },
            )
        return out

    def feed_sse(self, data: bytes) -> bytes:
        """Translate raw upstream SSE bytes (split anywhere); `data: [DONE]` ends the message."""
        self._buf += data
        out = b""
        while True:
            cut = self._buf.find(b"\n\n")
            if cut < 0:
                break
            event, self._buf = self._buf[:cut], self._buf[cut + 2 :]
            for line in event.split(b"\n"):
                line = line.rstrip(b"\r")
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    out += self.finish()
                elif payload:
                    try:
                        chunk = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        continue  # not a chunk (a comment or keep-alive); nothing to translate
                    if isinstance(chunk, dict):
                        if "error" in chunk and not chunk.get("choices"):
                            out += self.error(message_of(payload))
                        else:
                            out += self.feed(chunk)
        return out

    def finish(self) -> bytes:
        """Close the message (message_delta with stop reason and usage, then message_stop)."""
        if self._finished:
            return b""
        out = b"" if self._started else self._start(None)
        out += self._close_block()
        self._finished = True
        return (
            out
            + sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": self.stop_reason or "end_turn",
                        "stop_sequence": self.stop_sequence,
                    },
                    "usage": self._final_usage(),
                },
            )
            + sse_event("message_stop", {"type": "message_stop"})
        )

    def _final_usage(self) -> dict[str, int]:
        # message_start went out before the engine reported prompt_tokens (the usage chunk
        # comes last); message_delta's counts are cumulative and overwrite it.
        usage = {"output_tokens": self.output_tokens}
        if self.input_tokens:
            usage["input_tokens"] = self.input_tokens
        return usage

    def error(self, message: str, type_: str = "api_error") -> bytes:
        """An Anthropic `error` event; the stream ends after it."""
        self._finished = True
        return anthropic_sse_error(500, message, type_=type_)
