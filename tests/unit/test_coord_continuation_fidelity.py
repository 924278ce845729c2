"""A broken stream is continued only where the continuation can honour it: not a request
with tools, logprobs or guided decoding, and not a stream that already delivered reasoning
or tool calls (the continuation prompt carries content only). Chunk shapes are vLLM's
(`ChatCompletionStreamResponse` with a `DeltaMessage`: `tool_calls` deltas, reasoning as
`reasoning_content` in older releases and `reasoning` in newer)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from coordinator.proxy.continuation import ProgressFold, not_continuable, refused_by


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


def chunk(delta: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
    }


ROLE = chunk({"role": "assistant", "content": ""})
TEXT = chunk({"content": "Hello"})
TOOL = chunk(
    {
        "tool_calls": [
            {
                "id": "chatcmpl-tool-1",
                "type": "function",
                "index": 0,
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
)
TOOL_ARGS = chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]})
REASONING_OLD = chunk({"reasoning_content": "Let me think"})
REASONING_NEW = chunk({"reasoning": "Let me think"})
MESSAGES = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (MESSAGES, None),
        ({**MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({**MESSAGES, "tool_choice": "required"}, "tool_choice"),
        ({**MESSAGES, "logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": 1}, "logprobs"),
        ({**MESSAGES, "guided_json": {"type": "object"}}, "guided_json"),
        ({**MESSAGES, "structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({**MESSAGES, "response_format": {"type": "json_object"}}, "response_format"),
        ({**MESSAGES, "response_format": {"type": "text"}}, None),
        ({**MESSAGES, "n": 2}, "n"),
        ({**MESSAGES, "logprobs": False}, None),
    ],
)
def test_what_a_continuation_cannot_honour(body: dict[str, Any], field: str | None) -> None:
    assert refused_by(body) == field


@pytest.mark.parametrize(
    ("chunks", "beyond"),
    [
        ((ROLE, TEXT), None),
        ((ROLE, TOOL, TOOL_ARGS), "tool calls"),
        ((ROLE, REASONING_OLD, TEXT), "reasoning"),
        ((ROLE, REASONING_NEW), "reasoning"),
        ((ROLE, TEXT, chunk({"content": " world", "reasoning_content": None, "tool_calls": []})), None),
    ],
)
def test_a_stream_that_delivered_reasoning_or_tool_calls_is_not_continued(
    chunks: tuple[dict[str, Any], ...], beyond: str | None
) -> None:
    f = ProgressFold()
    f.feed(sse(*chunks))
    p = f.result()
    assert p.beyond_text == beyond
    why = not_continuable(MESSAGES, p)
    assert (why is None) is (beyond is None)
    if beyond is not None:
        assert why is not None and beyond in why


def test_the_reason_names_the_field() -> None:
    f = ProgressFold()
    f.feed(sse(ROLE, TEXT))
    why = not_continuable({**MESSAGES, "tools": [{"type": "function"}]}, f.result())
    assert why is not None and "'tools'" in why
