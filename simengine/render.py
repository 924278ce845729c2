"""Response bodies and SSE chunks in vLLM's exact shapes.

Streamed chunks are built from pre-encoded prefix/suffix bytes around the JSON-encoded text,
because one `orjson.dumps` of a dict per token would dominate the CPU of a fast stream.
"""

from __future__ import annotations

from typing import Any

import orjson

from simengine.openai_api import GenRequest

DONE = b"data: [DONE]\n\n"


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """The `usage` object, with cached prefix tokens in `prompt_tokens_details`."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def response_id(g: GenRequest) -> str:
    """vLLM's response id: the request id behind the endpoint's prefix."""
    return ("chatcmpl-" if g.chat else "cmpl-") + g.rid


def full_body(
    g: GenRequest,
    created: int,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    use: dict[str, Any],
    kv_transfer_params: dict[str, Any] | None,
) -> bytes:
    """A non-streamed chat.completion or text_completion body."""
    if g.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": response_id(g),
            "object": obj,
            "created": created,
            "model": g.model,
            "choices": [choice],
            "usage": use,
            **({"prompt_logprobs": None} if g.chat else {}),
            "system_fingerprint": None,
            "kv_transfer_params": kv_transfer_params,
        }
    )


class StreamFormat:
    """Builds the SSE events of one streamed response."""

    __slots__ = ("_chat", "_head", "_usage_head", "g")

    def __init__(self, g: GenRequest, created: int) -> None:
        self.g = g
        self._chat = g.chat
        kind = "chat.completion.chunk" if g.chat else "text_completion"
        head = orjson.dumps({"id": response_id(g), "object": kind, "created": created, "model": g.model})
        self._head = b"data: " + head[:-1] + b',"choices":[{"index":0,'
        self._usage_head = b"data: " + head[:-1] + b',"choices":[],"usage":'

    def role(self) -> bytes:
        """The first chat chunk: the assistant role with empty content."""
        return (
            self._head
            + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def piece(self, text: str, finish_reason: str | None = None, stop_reason: str | None = None) -> bytes:
        """One chunk carrying `text`; the last one also carries the finish reason."""
        enc = orjson.dumps(text)
        body = b'"delta":{"content":' + enc + b"}" if self._chat else b'"text":' + enc
        if finish_reason is None:
            tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
        else:
            tail = (
                b',"logprobs":null,"finish_reason":"'
                + finish_reason.encode()
                + b'","stop_reason":'
                + orjson.dumps(stop_reason)
                + b"}]}\n\n"
            )
        return self._head + body + tail

    def all_pieces(self, pieces: tuple[str, ...], finish_reason: str, stop_reason: str | None) -> list[bytes]:
        """Every token event of a whole answer at once (the --fast path), one bytes per event;
        empty pieces skipped."""
        dumps = orjson.dumps
        pre = self._head + (b'"delta":{"content":' if self._chat else b'"text":')
        mid = (
            b"}" if self._chat else b""
        ) + b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
        out: list[bytes] = []
        for piece in pieces[:-1]:
            if piece:
                out.append(pre + dumps(piece) + mid)
        out.append(self.piece(pieces[-1], finish_reason, stop_reason))
        return out

    def piece_with_usage(self, text: str, finish: str | None, stop: str | None, use: dict[str, Any]) -> bytes:
        """A chunk with continuous usage stats (`stream_options.continuous_usage_stats`)."""
        chunk = self.piece(text, finish, stop)
        return chunk[:-3] + b',"usage":' + orjson.dumps(use) + b"}\n\n"

    def usage(self, use: dict[str, Any]) -> bytes:
        """The final usage chunk (`stream_options.include_usage`): no choices."""
        return self._usage_head + orjson.dumps(use) + b"}\n\n"


def models_body(names: tuple[str, ...], created: int, max_model_len: int) -> bytes:
    """`/v1/models` as vLLM answers it, owned by the simulator."""
    data: list[dict[str, Any]] = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "motor-builtin-simulator",
            "root": names[0],
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [],
        }
        for name in names
    ]
    return orjson.dumps({"object": "list", "data": data})
