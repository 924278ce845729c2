"""Anthropic ↔ OpenAI translation: requests, responses, streams, token counts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from coordinator.anthropic import StreamTranslator, chat_to_message, count_tokens, messages_to_chat
from coordinator.errors import CoordinatorError


def body(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    out.update(kw)
    return out


def test_simple_request() -> None:
    chat = messages_to_chat(body(system="be brief", temperature=0.5, stop_sequences=["END"]))
    assert chat == {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "stop": ["END"],
    }


def test_stream_request_asks_for_usage() -> None:
    chat = messages_to_chat(body(stream=True))
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_simple_response() -> None:
    resp = {
        "id": "chatcmpl-abc",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
    }
    msg = chat_to_message(resp, "m")
    assert msg == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 16},
    }


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"model": None}, "model"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"temperature": 3}, "temperature"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_bad_fields_are_400_naming_the_field(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(CoordinatorError) as exc:
        messages_to_chat(body(**patch))
    assert exc.value.status == 400
    assert exc.value.message.startswith(field + ":")


def test_stream_translation_simple() -> None:
    tr = StreamTranslator("m")
    out = tr.feed(
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    )
    out += tr.feed({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    out += tr.feed(
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}
    )
    out += tr.feed({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    out += tr.finish()
    events = [
        (block.split(b"\n")[0][7:].decode(), orjson.loads(block.split(b"\n")[1][6:]))
        for block in out.strip().split(b"\n\n")
    ]
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["id"] == "msg_1"
    assert events[6][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 2},
    }
    assert tr.text == "Hello"


def test_count_tokens_simple() -> None:
    small = count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}]})["input_tokens"]
    big = count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi " * 100}]})["input_tokens"]
    assert 0 < small < big
