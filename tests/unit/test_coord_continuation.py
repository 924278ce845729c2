"""Mid-stream continuation: progress recovered from SSE bytes, continuation bodies, splicing."""

from __future__ import annotations

import orjson
import pytest

from coordinator.proxy.continuation import (
    Progress,
    StreamSplicer,
    continuation_body,
    progress_of,
    split_events,
)


def chat_chunk(content: str | None, role: bool = False, finish: str | None = None, cid: str = "c1") -> bytes:
    delta: dict[str, object] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    obj = {"id": cid, "created": 7, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_split_events_keeps_the_unfinished_rest() -> None:
    events, rest = split_events(b"data: a\n\ndata: b\r\n\r\ndata: c")
    assert events == [b"a", b"b"]
    assert rest == b"data: c"


def test_progress_of_chat_stream() -> None:
    data = chat_chunk("", role=True) + chat_chunk("Hello") + chat_chunk(" world")
    p = progress_of(data)
    assert (p.text, p.tokens, p.done, p.clean, p.stream_id, p.created) == (
        "Hello world",
        2,
        False,
        True,
        "c1",
        7,
    )


def test_progress_of_completion_stream_done_and_cut() -> None:
    data = b'data: {"id":"x","choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n'
    assert progress_of(data).done
    assert not progress_of(b'data: {"id":"x","choices":[{"text":"a"}]}\n\ndata: {"id"').clean


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"messages": [{"role": "user", "content": "q"}], "max_tokens": 10, "stream": True},
            {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ab"}],
                "max_tokens": 8,
                "stream": True,
                "continue_final_message": True,
                "add_generation_prompt": False,
            },
        ),
        (
            {"messages": [], "max_completion_tokens": 2, "stream": True},
            None,  # budget spent
        ),
        ({"messages": [], "n": 2, "stream": True}, None),
    ],
)
def test_chat_continuation_body(body: dict[str, object], expected: dict[str, object] | None) -> None:
    p = Progress(text="ab", tokens=2)
    assert continuation_body(b"/v1/chat/completions", body, p) == expected


def test_completion_continuation_body() -> None:
    p = Progress(text=" more", tokens=3)
    out = continuation_body(b"/v1/completions", {"prompt": "P", "max_tokens": 5, "min_tokens": 4}, p)
    assert out == {"prompt": "P more", "max_tokens": 2}


def test_splicer_drops_role_delta_and_keeps_the_stream_id() -> None:
    s = StreamSplicer(Progress(stream_id="orig", created=1))
    out = s.feed(chat_chunk("", role=True, cid="new") + chat_chunk("x", cid="new")[:20])
    assert out == b""
    out = s.feed(chat_chunk("x", cid="new")[20:] + b"data: [DONE]\n\n")
    events, rest = split_events(out)
    assert rest == b""
    assert orjson.loads(events[0])["id"] == "orig"
    assert orjson.loads(events[0])["created"] == 1
    assert events[1] == b"[DONE]" and s.done
