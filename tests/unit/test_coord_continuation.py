"""Mid-stream continuation: progress recovered from SSE bytes, continuation bodies, splicing."""

from __future__ import annotations

import orjson
import pytest

from coordinator.proxy.continuation import (
    EventSplitter,
    Progress,
    ProgressFold,
    StreamSplicer,
    continuation_body,
    progress_of,
)


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    s = EventSplitter()
    return s.feed(buf), s.rest()


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


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_event_splitter_fed_in_pieces_of_any_size(size: int) -> None:
    body = b"data: a\n\ndata: b\r\n\r\nevent: x\ndata: c\ndata: d\r\n\r\n: comment\n\ndata: e"
    s = EventSplitter()
    out: list[bytes] = []
    for i in range(0, len(body), size):
        out += s.feed(body[i : i + size])
    assert out == [b"a", b"b", b"c\nd"]
    assert s.rest() == b"data: e"


def test_event_splitter_is_linear_on_an_event_that_never_ends() -> None:
    """10 MiB of one event in 1 KiB pieces: each byte searched once (a rescan of the buffer
    per piece is ~50 GB of searching), the event dropped past the limit and counted."""
    s = EventSplitter(limit=1 << 20)
    piece = b"x" * 1024
    s.feed(b"data: ")
    for _ in range(10 * 1024):
        assert s.feed(piece) == []
    assert len(s.buf) <= (1 << 20) + 1024
    assert s.dropped == 1
    assert s.feed(b"\n\ndata: next\n\n") == [b"next"]  # the stream goes on after it
    assert s.dropped == 1


def test_progress_fold_equals_progress_of_whatever_the_pieces() -> None:
    body = chat_chunk("", role=True) + b"".join(chat_chunk(w) for w in ("a", "b", "c")) + b"data: [DONE]\n\n"
    want = progress_of(body)
    for size in (1, 5, 50):
        f = ProgressFold()
        for i in range(0, len(body), size):
            f.feed(body[i : i + size])
        got = f.result()
        assert (
            (got.text, got.tokens, got.done, got.clean, got.stream_id)
            == (
                want.text,
                want.tokens,
                want.done,
                want.clean,
                want.stream_id,
            )
            == ("abc", 3, True, True, "c1")
        )


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
