"""Anthropic ↔ OpenAI translation: requests, responses, streams, token counts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from coordinator.anthropic import (
    StreamTranslator,
    chat_to_message,
    count_tokens,
    estimate_tokens,
    messages_to_chat,
)
from coordinator.errors import CoordinatorError

STREAM_EVENT: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


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
        "usage": {"output_tokens": 2, "input_tokens": 3},
    }
    assert tr.text == "Hello"


def test_count_tokens_simple() -> None:
    small = count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}]})["input_tokens"]
    big = count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi " * 100}]})["input_tokens"]
    assert 0 < small < big


# --------------------------------------------------------------------------- requests, in depth


def test_tools_and_tool_choice() -> None:
    tool = {
        "name": "get_weather",
        "description": "Weather",
        "input_schema": {"type": "object", "properties": {}},
    }
    chat = messages_to_chat(body(tools=[tool], tool_choice={"type": "tool", "name": "get_weather"}))
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {}},
                "description": "Weather",
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert messages_to_chat(body(tools=[tool], tool_choice={"type": "any"}))["tool_choice"] == "required"
    assert messages_to_chat(body(tool_choice={"type": "none"}))["tool_choice"] == "none"
    chat = messages_to_chat(body(tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False


def test_a_tool_round_trip_conversation() -> None:
    msgs = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "let me call the tool", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "18C"}],
                },
                {"type": "text", "text": "and tomorrow?"},
            ],
        },
    ]
    chat = messages_to_chat(
        body(messages=msgs, system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    )
    assert chat["messages"] == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": "and tomorrow?"},
    ]


def test_tool_errors_are_marked() -> None:
    msgs = [
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}],
        }
    ]
    assert messages_to_chat(body(messages=msgs))["messages"] == [
        {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}
    ]


def test_images_become_image_url_parts() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "text", "text": "what is this?"},
    ]
    chat = messages_to_chat(body(messages=[{"role": "user", "content": content}]))
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "text", "text": "what is this?"},
    ]


def test_other_sampling_fields() -> None:
    chat = messages_to_chat(body(top_p=0.9, top_k=40, metadata={"user_id": "u1"}, stop_sequences=[]))
    assert (chat["top_p"], chat["top_k"], chat["user"]) == (0.9, 40, "u1")
    assert "stop" not in chat


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]},
            "messages[0].content[0].source.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"system": 5}, "system"),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ({"tools": [{"name": "s", "type": "web_search_20250305"}]}, "tools[0].type"),
        ({"tools": "x"}, "tools"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_more_bad_fields(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(CoordinatorError) as exc:
        messages_to_chat(body(**patch))
    assert exc.value.status == 400 and exc.value.message.startswith(field + ":"), exc.value.message


# --------------------------------------------------------------------------- responses, in depth


def test_tool_call_response_validates_as_an_sdk_message() -> None:
    resp = {
        "id": "chatcmpl-9",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "g", "arguments": "not json"},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    msg = Message.model_validate(chat_to_message(resp, "m"))
    assert msg.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in msg.content] == [  # type: ignore[union-attr]
        ("tool_use", "f", {"a": 1}),
        ("tool_use", "g", {"_raw": "not json"}),
    ]


def test_matched_stop_string_becomes_stop_sequence() -> None:
    resp = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop", "stop_reason": "END"}]}
    msg = Message.model_validate(chat_to_message(resp, "m"))
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "END")
    resp["choices"][0]["stop_reason"] = 128001  # an EOS token id: an ordinary end of turn
    assert chat_to_message(resp, "m")["stop_reason"] == "end_turn"


# --------------------------------------------------------------------------- streams, in depth


def chunks_to_sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def parse_events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.strip().split(b"\n\n"):
        name_line, data_line = block.split(b"\n")
        payload = orjson.loads(data_line.removeprefix(b"data: "))
        assert name_line == b"event: " + payload["type"].encode()
        out.append(payload)
    return out


def accumulate(raw: bytes) -> Any:
    """The final message as the official SDK's stream accumulator builds it."""
    snapshot = None
    bufs: dict[int, bytes] = {}
    for payload in parse_events(raw):
        if payload["type"] == "ping":
            continue
        event = STREAM_EVENT.validate_python(payload)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    return snapshot


TOOL_STREAM = [
    {"id": "chatcmpl-7", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]},
    {"id": "chatcmpl-7", "choices": [{"index": 0, "delta": {"content": "check."}}]},
    {
        "id": "chatcmpl-7",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "weather", "arguments": ""},
                        }
                    ]
                },
            }
        ],
    },
    {
        "id": "chatcmpl-7",
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}}
        ],
    },
    {
        "id": "chatcmpl-7",
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}}
        ],
    },
    {
        "id": "chatcmpl-7",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": 1, "id": "call_b", "function": {"name": "time", "arguments": "{}"}}
                    ]
                },
            }
        ],
    },
    {"id": "chatcmpl-7", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {
        "id": "chatcmpl-7",
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20},
    },
]


def test_streamed_text_and_tool_calls_accumulate_in_the_sdk() -> None:
    tr = StreamTranslator("m")
    final = accumulate(tr.feed_sse(chunks_to_sse(TOOL_STREAM)))
    assert tr.finished
    assert final.id == "msg_7" and final.model == "m" and final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[0].text == "Let me check."
    assert (final.content[1].id, final.content[1].name, final.content[1].input) == (
        "call_a",
        "weather",
        {"city": "Paris"},
    )
    assert (final.content[2].name, final.content[2].input) == ("time", {})
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 9)


def test_sse_split_anywhere_translates_the_same() -> None:
    raw = chunks_to_sse(TOOL_STREAM)
    whole = StreamTranslator("m", message_id="msg_x").feed_sse(raw)
    for cut in range(1, len(raw), 7):
        tr = StreamTranslator("m", message_id="msg_x")
        assert tr.feed_sse(raw[:cut]) + tr.feed_sse(raw[cut:]) == whole


def test_stream_ending_without_done_is_closed_by_finish() -> None:
    tr = StreamTranslator("m")
    out = tr.feed_sse(
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"length"}]}\n\n'
    )
    out += tr.finish()
    assert tr.finish() == b""  # idempotent
    final = accumulate(out)
    assert final.content[0].text == "hi" and final.stop_reason == "max_tokens"


def test_empty_stream_is_still_a_valid_message() -> None:
    final = accumulate(StreamTranslator("m").finish())
    assert final.content == [] and final.stop_reason == "end_turn"


def test_engine_error_mid_stream_becomes_an_error_event() -> None:
    tr = StreamTranslator("m")
    out = tr.feed_sse(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
    out += tr.feed_sse(b'data: {"error": {"message": "engine died", "type": "server_error"}}\n\n')
    events = parse_events(out)
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}
    assert tr.finished and tr.feed_sse(b"data: [DONE]\n\n") == b""


def test_keepalive_comments_and_crlf_are_tolerated() -> None:
    tr = StreamTranslator("m")
    out = tr.feed_sse(b": keep-alive\n\n")
    out += tr.feed_sse(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"}}]}\r\n\n')
    out += tr.feed_sse(b"data: [DONE]\n\n")
    assert accumulate(out).content[0].text == "x"


# --------------------------------------------------------------------------- count_tokens


def test_count_tokens_grows_with_tools_images_and_cjk() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    n = count_tokens(base)["input_tokens"]
    tool = {"name": "f", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    assert count_tokens({**base, "tools": [tool]})["input_tokens"] > n
    img = {"type": "image", "source": {"type": "url", "url": "https://x"}}
    with_img = {
        "model": "m",
        "messages": [{"role": "user", "content": [img, {"type": "text", "text": "hello"}]}],
    }
    assert count_tokens(with_img)["input_tokens"] >= n + 85
    assert estimate_tokens("你好世界") == 4
    assert estimate_tokens("internationalization") == 5
    assert estimate_tokens("a, b.") == 4


def test_count_tokens_validates_like_messages() -> None:
    with pytest.raises(CoordinatorError) as exc:
        count_tokens({"messages": [{"role": "user", "content": "x"}]})
    assert exc.value.message.startswith("model:")
    with pytest.raises(CoordinatorError):
        count_tokens({"model": "m", "messages": []})
