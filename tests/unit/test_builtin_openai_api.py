"""Request validation of the builtin engine: what vLLM accepts, and the 400/404 it gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from simengine.openai_api import ApiError, parse_chat, parse_completion, parse_json
from simengine.prompt import analyze
from simengine.render import StreamFormat, full_body, usage

NAMES = ("motor-sim", "alias")
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def chat(**extra: Any) -> dict[str, Any]:
    return {**CHAT, **extra}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (chat(model="nope"), 404, "model"),
        (chat(model=3), 400, "model"),
        (chat(max_tokens=0), 400, "max_tokens"),
        (chat(max_tokens="5"), 400, "max_tokens"),
        (chat(max_tokens=True), 400, "max_tokens"),
        (chat(max_completion_tokens=0), 400, "max_completion_tokens"),
        (chat(temperature=-0.1), 400, "temperature"),
        (chat(temperature="hot"), 400, "temperature"),
        (chat(top_p=0), 400, "top_p"),
        (chat(top_p=1.5), 400, "top_p"),
        (chat(n=2), 400, "n"),
        (chat(n=0), 400, "n"),
        (chat(stop=[1, 2]), 400, "stop"),
        (chat(seed=1.5), 400, "seed"),
        (chat(stream="yes"), 400, "stream"),
        (chat(stream_options={"include_usage": True}), 400, "stream_options"),
        (chat(stream=True, stream_options=[1]), 400, "stream_options"),
        (chat(kv_transfer_params="x"), 400, "kv_transfer_params"),
        (chat(bootstrap_host="h", bootstrap_port=1), 400, None),
        (chat(bootstrap_host="h", bootstrap_port=0, bootstrap_room=1), 400, "bootstrap_port"),
        (chat(rid=""), 400, "rid"),
        (chat(min_tokens=-1), 400, "min_tokens"),
        (chat(add_generation_prompt=True, continue_final_message=True), 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
        # Found by the fuzzer: an unhashable role was a TypeError, a 500 that opened the
        # coordinator's circuit for every client.
        ({"messages": [{"role": ["user"], "content": "x"}]}, 400, "messages"),
        ({"messages": [{"role": {"a": 1}, "content": "x", "name": "n"}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "messages"),
        ({"messages": "hi"}, 400, "messages"),
        ({}, 400, "messages"),
    ],
)
def test_bad_chat_requests(body: dict[str, Any], status: int, param: str | None) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat(body, NAMES)
    assert err.value.status == status
    assert err.value.param == param
    shape = orjson.loads(err.value.body())
    assert set(shape["error"]) == {"message", "type", "param", "code"}
    assert shape["error"]["code"] == status


@pytest.mark.parametrize(
    "prompt",
    ["", [], [[1], [2]], ["a", "b"], 5, [1.5], None, [True]],
)
def test_bad_completion_prompts(prompt: Any) -> None:
    with pytest.raises(ApiError) as err:
        parse_completion({"prompt": prompt}, NAMES)
    assert err.value.status == 400 and err.value.param == "prompt"


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'"x"', b"null"])
def test_bodies_that_are_not_json_objects(raw: bytes) -> None:
    with pytest.raises(ApiError) as err:
        parse_json(raw)
    assert err.value.status == 400


def test_good_chat_request_fields() -> None:
    g = parse_chat(
        chat(
            model="alias",
            max_completion_tokens=9,
            max_tokens=3,
            temperature=0.5,
            seed=4,
            stop="\n",
            stream=True,
            stream_options={"include_usage": True},
            rid="r-1",
            kv_transfer_params={"do_remote_decode": True},
            bootstrap_host="10.0.0.1",
            bootstrap_port=8998,
            bootstrap_room=42,
        ),
        NAMES,
    )
    assert (g.chat, g.rid, g.model, g.max_tokens, g.stream, g.include_usage) == (
        True,
        "r-1",
        "alias",
        9,
        True,
        True,
    )
    assert (g.sampling.temperature, g.sampling.seed, g.sampling.stop) == (0.5, 4, ("\n",))
    assert g.bootstrap is not None and (g.bootstrap.host, g.bootstrap.port, g.bootstrap.room) == (
        "10.0.0.1",
        8998,
        42,
    )
    assert g.kv_transfer == {"do_remote_decode": True}
    assert g.prompt_text is not None and g.prompt_text.endswith("<|assistant|>\n")


@pytest.mark.parametrize(
    ("prompt", "n_tokens", "has_text"),
    [("Hello, world!", 4, True), ([5, 6, 7], 3, False), (["one prompt"], 2, True), ([[1, 2]], 2, False)],
)
def test_good_completion_prompts(prompt: Any, n_tokens: int, has_text: bool) -> None:
    g = parse_completion({"prompt": prompt}, NAMES)
    assert analyze(g.prompt_text, g.prompt_ids, 16).length == n_tokens
    assert (g.prompt_text is not None) == has_text
    assert g.model == "motor-sim" and g.max_tokens is None


def test_request_id_precedence() -> None:
    assert parse_completion({"prompt": "x", "rid": "a", "request_id": "b"}, NAMES, "c").rid == "a"
    assert parse_completion({"prompt": "x", "request_id": "b"}, NAMES, "c").rid == "b"
    assert parse_completion({"prompt": "x"}, NAMES, "c").rid == "c"
    assert len(parse_completion({"prompt": "x"}, NAMES).rid) == 32


def test_full_body_shapes() -> None:
    g = parse_chat(chat(rid="abc"), NAMES)
    body = orjson.loads(full_body(g, 1, "Hi", "length", None, usage(5, 1, 0), None))
    assert body["id"] == "chatcmpl-abc" and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hi",
        "reasoning_content": None,
        "tool_calls": [],
    }
    assert body["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 6,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    c = parse_completion({"prompt": "x", "rid": "abc"}, NAMES)
    body = orjson.loads(full_body(c, 1, "Hi", "stop", "\n", usage(1, 1, 0), {"k": 1}))
    assert body["id"] == "cmpl-abc" and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hi" and body["choices"][0]["stop_reason"] == "\n"
    assert body["kv_transfer_params"] == {"k": 1}


def _event(raw: bytes) -> dict[str, Any]:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    obj: dict[str, Any] = orjson.loads(raw[6:-2])
    return obj


def test_stream_chunks_are_valid_json_with_vllm_fields() -> None:
    g = parse_chat(chat(rid="s"), NAMES)
    fmt = StreamFormat(g, 7)
    role = _event(fmt.role())
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    piece = _event(fmt.piece(' "quoted"\n'))
    assert (
        piece["choices"][0]["delta"] == {"content": ' "quoted"\n'}
        and piece["choices"][0]["finish_reason"] is None
    )
    last = _event(fmt.piece("x", "stop", "END"))
    assert (last["choices"][0]["finish_reason"], last["choices"][0]["stop_reason"]) == ("stop", "END")
    assert last["object"] == "chat.completion.chunk" and last["id"] == "chatcmpl-s" and last["created"] == 7
    use = _event(fmt.usage(usage(3, 2, 1)))
    assert use["choices"] == [] and use["usage"]["total_tokens"] == 5
    cont = _event(fmt.piece_with_usage("y", None, None, usage(3, 1, 0)))
    assert cont["usage"]["completion_tokens"] == 1 and cont["choices"][0]["delta"] == {"content": "y"}
    comp = StreamFormat(parse_completion({"prompt": "x"}, NAMES), 1)
    assert _event(comp.piece("t"))["choices"][0]["text"] == "t"


@pytest.mark.parametrize("chat_api", [True, False])
def test_all_pieces_equals_chunk_by_chunk(chat_api: bool) -> None:
    g = parse_chat(chat(rid="s"), NAMES) if chat_api else parse_completion({"prompt": "x", "rid": "s"}, NAMES)
    fmt = StreamFormat(g, 7)
    pieces = ("A", " b", "", " c\n")
    by_one = [fmt.piece(p) for p in pieces[:-1] if p] + [fmt.piece(pieces[-1], "stop", "\n")]
    assert fmt.all_pieces(pieces, "stop", "\n") == by_one  # one bytes per event
