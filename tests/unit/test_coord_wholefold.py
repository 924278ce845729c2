"""A whole answer folded from stream chunks: which bodies are asked as streams, and the body
folded over one or more segments (text, finish_reason, ids, usage summed across a cut)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from coordinator.proxy.continuation import continuation_body
from coordinator.proxy.wholefold import STREAM_OPTIONS, WholeFold, streamed_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": "m", "prompt": "Once"}


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chat_chunk(
    cid: str,
    content: str | None,
    n: int | None = None,
    prompt: int = 5,
    finish: str | None = None,
    role: bool = False,
) -> bytes:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": content}
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if not role:
        choice["stop_reason"] = None
    obj: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 100 if cid == "first" else 200,
        "model": "m",
        "choices": [choice],
    }
    if n is not None:
        obj["usage"] = usage(prompt, n)
    return sse(obj)


def comp_chunk(
    cid: str, text: str, n: int | None = None, prompt: int = 3, finish: str | None = None
) -> bytes:
    obj: dict[str, Any] = {
        "id": cid,
        "object": "text_completion",
        "created": 100,
        "model": "m",
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        ],
    }
    if n is not None:
        obj["usage"] = usage(prompt, n)
    return sse(obj)


def final_usage(cid: str, prompt: int, n: int) -> bytes:
    return sse(
        {"id": cid, "object": "x", "created": 1, "model": "m", "choices": [], "usage": usage(prompt, n)}
    )


@pytest.mark.parametrize(
    ("chat", "body", "folded"),
    [
        (True, {**CHAT, "max_tokens": 16}, False),  # short: the plain whole path
        (True, {**CHAT, "max_tokens": 32}, True),
        (True, CHAT, True),  # no budget: as long as the engine likes
        (True, {**CHAT, "max_tokens": 100, "max_completion_tokens": 8}, False),  # the one engines use
        (False, {**COMP, "max_tokens": 31}, False),
        (False, {**COMP, "max_tokens": 40}, True),
        (True, {**CHAT, "n": 2}, False),
        (True, {**CHAT, "logprobs": True, "top_logprobs": 2}, False),
        (True, {**CHAT, "logprobs": False}, True),
        (True, {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, False),
        (True, {**CHAT, "response_format": {"type": "json_object"}}, False),
        (True, {**CHAT, "response_format": {"type": "text"}}, True),
        (True, {**CHAT, "stream_options": {"include_usage": True}}, False),  # the engine's 400 stays
        (True, {**CHAT, "continue_final_message": True}, False),
        (False, {**COMP, "echo": True}, False),
        (False, {**COMP, "logprobs": 2}, False),
        (False, {**COMP, "prompt": ["a", "b"]}, False),
        (False, {**COMP, "best_of": 3}, False),
        (True, {**CHAT, "messages": "not a list"}, False),
    ],
)
def test_streamed_body_only_for_long_continuable_answers(
    chat: bool, body: dict[str, Any], folded: bool
) -> None:
    out = streamed_body(chat, body, 32)
    if not folded:
        assert out is None
        return
    assert out is not None
    assert out == {**body, "stream": True, "stream_options": STREAM_OPTIONS}
    assert "stream" not in body  # the client's body is not touched


def test_one_segment_folds_to_the_whole_body() -> None:
    f = WholeFold(chat=True)
    data = (
        chat_chunk("first", None, role=True)
        + chat_chunk("first", "Hello", 1)
        + chat_chunk("first", " world", 2, finish="length")
        + final_usage("first", 5, 2)
        + b"data: [DONE]\n\n"
    )
    for i in range(0, len(data), 7):  # any split of the bytes
        f.feed(data[i : i + 7])
    assert f.answer() == {
        "id": "first",
        "object": "chat.completion",
        "created": 100,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello world"},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": usage(5, 2),
    }  # no null vendor field invented: the engine's chunks carried none


def test_a_cut_answer_continued_sums_usage_and_keeps_the_first_id() -> None:
    f = WholeFold(chat=False)
    f.feed(comp_chunk("first", " one", 1) + comp_chunk("first", " two", 2) + b'data: {"id": "first", "cho')
    p = f.cut()
    assert (p.text, p.tokens, p.done, p.stream_id, p.created) == (" one two", 2, False, "first", 100)
    body = continuation_body(b"/v1/completions", {**COMP, "max_tokens": 5, "stream": True}, p)
    assert body is not None and body["prompt"] == "Once one two" and body["max_tokens"] == 3
    # The continuation's prompt holds the partial text: 3 + 2 tokens.
    f.feed(
        comp_chunk("second", " three", 1, prompt=5)
        + comp_chunk("second", " four", 2, prompt=5)
        + comp_chunk("second", " five", 3, prompt=5, finish="stop")
        + final_usage("second", 5, 3)
    )
    out = f.answer()
    assert out["id"] == "first" and out["created"] == 100 and out["object"] == "text_completion"
    assert out["choices"] == [
        {
            "index": 0,
            "text": " one two three four five",
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": None,
        }
    ]
    assert out["usage"] == usage(3, 5)  # the client's prompt, every generated token


def test_without_usage_tokens_are_counted_and_the_prompt_estimated() -> None:
    f = WholeFold(chat=True)
    f.feed(chat_chunk("first", None, role=True) + chat_chunk("first", "a") + chat_chunk("first", " b"))
    assert f.cut().tokens == 2
    f.feed(chat_chunk("second", " c", finish="stop") + final_usage("second", 9, 1))
    out = f.answer()
    assert out["choices"][0]["message"]["content"] == "a b c"
    assert out["usage"]["prompt_tokens"] == 7  # 9 minus the two tokens of text it carried
    assert out["usage"]["completion_tokens"] == 3
    assert out["usage"]["prompt_tokens_details"] is None  # the continuation's cache is not the client's


def test_cut_twice_counts_each_segment_once() -> None:
    f = WholeFold(chat=False)
    f.feed(comp_chunk("first", " a", 1))
    assert f.cut().tokens == 1
    f.feed(comp_chunk("second", " b", 1, prompt=4) + comp_chunk("second", " c", 2, prompt=4))
    assert f.cut().tokens == 3
    f.feed(comp_chunk("third", " d", 1, prompt=6, finish="length"))
    assert f.answer()["usage"] == usage(3, 4)


def test_a_finish_before_the_cut_is_a_done_answer() -> None:
    f = WholeFold(chat=True)
    f.feed(chat_chunk("first", "end", 1, finish="stop"))
    assert f.cut().done


def test_reasoning_makes_the_answer_not_continuable() -> None:
    f = WholeFold(chat=True)
    f.feed(sse({"id": "r", "choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]}))
    assert not f.continuable
    assert f.answer()["choices"][0]["message"]["reasoning_content"] == "think"


def test_an_error_event_is_the_answer() -> None:
    f = WholeFold(chat=True)
    f.feed(sse({"error": {"message": "boom", "type": "InternalServerError", "code": 500}}))
    status, body = f.error_answer()
    assert status == 500 and orjson.loads(body)["error"]["message"] == "boom"


def test_the_chunks_fingerprint_and_reasoning_key_are_kept_as_the_engine_named_them() -> None:
    f = WholeFold(chat=True)
    chunk = {"id": "r", "created": 1, "model": "m", "system_fingerprint": "vllm-0.32.0"}
    for delta in ({"role": "assistant"}, {"reasoning": "think"}, {"content": "ok"}):
        f.feed(b"data: " + orjson.dumps({**chunk, "choices": [{"index": 0, "delta": delta}]}) + b"\n\n")
    out = f.answer()
    assert out["system_fingerprint"] == "vllm-0.32.0"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "ok", "reasoning": "think"}
