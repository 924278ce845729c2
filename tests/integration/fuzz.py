"""Hypothesis strategies for the fuzz tests: request bodies a little off the API in every
direction, raw HTTP/1.1 requests around them, and the checks every answer must pass.

`MOTOR_FUZZ_EXAMPLES` sets the examples a strategy runs (`just test`: a few dozen; `just fuzz`:
thousands).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.integration.rawhttp import Reply, _Collect

EXAMPLES = int(os.environ.get("MOTOR_FUZZ_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)

# ------------------------------------------------------------------ JSON values

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


def off(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes any JSON value at all."""
    return st.one_of(valid, valid, valid, json_values)


def body(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with the required fields (each sometimes missing) and some optional ones."""
    req = {k: off(v) for k, v in required.items()}
    opt = {k: off(v) for k, v in optional.items()}
    base = st.fixed_dictionaries(req, optional=opt)
    dropped = st.fixed_dictionaries({}, optional={**req, **opt})
    extra = st.dictionaries(st.text(max_size=12), json_values, max_size=2)
    return st.one_of(base, base, base, dropped).flatmap(lambda b: extra.map(lambda e: {**e, **b}))


_text = st.text(max_size=80)
_tokens = st.integers(-2, 64) | st.integers(0, 6000)
_sampling = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "seed": st.integers(0, 2**31),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3) | st.text(max_size=4),
    "n": st.integers(0, 2),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 8),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "user": _text,
}


def openai_bodies(model: str) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """Chat, completions and embeddings bodies around the served model."""
    models = st.just(model) | st.text(max_size=12)
    role = st.sampled_from(["system", "user", "assistant", "developer", "tool"]) | st.text(max_size=6)
    message = body({"role": role, "content": _text}, {"name": st.text(max_size=6)})
    return {
        "/v1/chat/completions": body(
            {"model": models, "messages": st.lists(message, max_size=3)},
            {"max_tokens": _tokens, "max_completion_tokens": _tokens, **_sampling},
        ),
        "/v1/completions": body(
            {"model": models, "prompt": _text | st.lists(st.integers(0, 50000), max_size=8)},
            {"max_tokens": _tokens, "echo": st.booleans(), **_sampling},
        ),
        "/v1/embeddings": body(
            {
                "model": models,
                "input": _text | st.lists(_text, max_size=3) | st.lists(st.integers(0, 9), max_size=5),
            },
            {"encoding_format": st.sampled_from(["float", "base64"]), "dimensions": st.integers(-1, 9000)},
        ),
    }


def anthropic_bodies(model: str) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """/v1/messages and count_tokens bodies."""
    block = (
        body({"type": st.just("text"), "text": _text}, {})
        | body(
            {"type": st.just("image"), "source": body({"type": st.sampled_from(["base64", "url"])}, {})}, {}
        )
        | body({"type": st.just("tool_use"), "id": _text, "name": _text}, {"input": json_values})
        | body(
            {"type": st.just("tool_result"), "tool_use_id": _text},
            {"content": _text, "is_error": st.booleans()},
        )
    )
    message = body(
        {
            "role": st.sampled_from(["user", "assistant"]) | _text,
            "content": _text | st.lists(block, max_size=3),
        },
        {},
    )
    tool = body({"name": _text, "input_schema": st.just({"type": "object"})}, {"description": _text})
    fields = {
        "system": _text | st.lists(body({"type": st.just("text"), "text": _text}, {}), max_size=2),
        "temperature": st.floats(0, 1),
        "top_p": st.floats(0, 1),
        "top_k": st.integers(0, 50),
        "stop_sequences": st.lists(st.text(min_size=1, max_size=4), max_size=2),
        "stream": st.booleans(),
        "tools": st.lists(tool, max_size=2),
        "tool_choice": body({"type": st.sampled_from(["auto", "any", "none", "tool"])}, {"name": _text}),
        "metadata": body({}, {"user_id": _text}),
    }
    required = {"model": st.just(model) | _text, "messages": st.lists(message, max_size=3)}
    return {
        "/v1/messages": body({**required, "max_tokens": _tokens}, fields),
        "/v1/messages/count_tokens": body(required, fields),
    }


def native_bodies(model: str) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """The engine-native routes the coordinator passes through (seed 003)."""
    models = st.just(model) | st.text(max_size=12)
    sampling = body({}, {"max_new_tokens": _tokens, "temperature": st.floats(0, 2), "stop": _text})
    texts = _text | st.lists(_text, max_size=3)
    return {
        "/generate": body(
            {"text": _text}, {"model": models, "sampling_params": sampling, "stream": st.booleans()}
        ),
        "/v1/score": body(
            {"text_1": texts, "text_2": texts}, {"model": models, "query": _text, "items": texts}
        ),
        "/v1/rerank": body(
            {"query": _text, "documents": texts}, {"model": models, "top_n": st.integers(-1, 5)}
        ),
        "/tokenize": body({"prompt": _text}, {"model": models, "return_token_strs": st.booleans()}),
        "/detokenize": body({"tokens": st.lists(st.integers(-1, 2**40), max_size=5)}, {"model": models}),
    }


def refresh_bodies(port: int) -> st.SearchStrategy[dict[str, Any]]:
    """Seed 001 refresh bodies (pointing at `port`, where nothing listens)."""
    static = body(
        {
            "group_id": st.integers(0, 3),
            "max_seq_len": st.integers(0, 9000),
            "max_output_len": st.integers(0, 9000),
            "total_slots_num": st.integers(0, 6000),
            "total_block_num": st.integers(0, 2000),
            "block_size": st.integers(0, 200),
            "label": st.integers(0, 4),
            "role": st.sampled_from([80, 68, 85, 1]),
        },
        {},
    )
    dynamic = body(
        {"avail_slots_num": st.integers(0, 300), "avail_block_num": st.integers(0, 3000)},
        {"peers": st.lists(st.integers(0, 5), max_size=3)},
    )
    port_s = st.just(str(port)) | st.integers(0, 70000).map(str) | st.integers(1000, 70000)
    instance = body(
        {
            "id": st.integers(0, 5),
            "ip": st.just("127.0.0.1") | _text,
            "port": port_s,
            "metric_port": port_s,
            "model_name": st.text(min_size=1, max_size=8),
            "static_info": static,
            "dynamic_info": dynamic,
        },
        {
            "engine_type": st.sampled_from(["vllm", "sglang", "builtin", "tgi"]),
            "capabilities": st.lists(_text, max_size=2),
        },
    )
    return body(
        {"ids": st.lists(st.integers(0, 5), max_size=4), "instances": st.lists(instance, max_size=3)},
        {"event": st.sampled_from(["add", "del", "set", "nope"])},
    )


# ------------------------------------------------------------------ raw HTTP/1.1


@dataclass(frozen=True)
class RawRequest:
    """A request's bytes and what the checks need to know of it."""

    data: bytes
    path: str  # the route it was built around
    method: str = "POST"


_header_names = st.from_regex(r"\A[A-Za-z][A-Za-z0-9-]{0,24}\Z")
_header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)


def _mangle(path: str) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            path,
            path,
            path,
            path.replace("/", "%2F", 2).replace("%2F", "/", 1),
            "/" + path,
            path + "/",
            path.replace("/v1/", "/v1/./"),
            "/x/.." + path,
        ]
    ) | st.tuples(
        st.just(path), st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12)
    ).map(lambda t: t[0] + "?" + t[1])


def raw_requests(
    paths: dict[str, st.SearchStrategy[dict[str, Any]]], keys: list[str]
) -> st.SearchStrategy[RawRequest]:
    """Whole requests: method, mangled path, headers (auth mostly valid), framing and body."""

    @st.composite
    def build(draw: Any) -> RawRequest:
        path = draw(st.sampled_from(sorted(paths)))
        method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE", "OPTIONS", "HEAD", "PATCH"]))
        target = draw(_mangle(path))
        version = draw(st.sampled_from(["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/2.0"]))
        payload = draw(
            st.one_of(
                paths[path].map(orjson.dumps),
                paths[path].map(orjson.dumps),
                paths[path].map(orjson.dumps),
                paths[path].map(lambda b: orjson.dumps(b)[: max(1, len(orjson.dumps(b)) // 2)]),
                st.binary(max_size=200),
            )
        )
        headers: list[tuple[str, str]] = [("host", "fuzz")]
        auth = draw(st.sampled_from(["bearer", "bearer", "bearer", "x-api-key", "none", "garbage"]))
        key = draw(st.sampled_from(keys)) if keys else "k"
        if auth == "bearer":
            headers.append(("authorization", draw(st.sampled_from(["Bearer ", "bearer ", "BEARER  "])) + key))
        elif auth == "x-api-key":
            headers.append(("x-api-key", key))
        elif auth == "garbage":
            headers.append(("authorization", draw(_header_values)))
        if draw(st.booleans()):
            headers.append(("content-type", draw(st.sampled_from(["application/json", "text/plain", "x/y"]))))
        if draw(st.integers(0, 4)) == 0:
            headers.append(("x-request-id", draw(_header_values)))
        if draw(st.integers(0, 8)) == 0:
            headers.append(("expect", "100-continue"))
        if draw(st.booleans()):
            headers.append(("connection", draw(st.sampled_from(["close", "keep-alive", "upgrade", "x"]))))
        headers += draw(st.lists(st.tuples(_header_names, _header_values), max_size=3))
        framing = draw(st.sampled_from(["length"] * 6 + ["chunked", "wrong_length", "none"]))
        if framing == "length":
            headers.append(("content-length", str(len(payload))))
        elif framing == "wrong_length":
            headers.append(
                ("content-length", draw(st.sampled_from(["-1", "x", "99999999999999999999", "0", "5"])))
            )
        elif framing == "chunked":
            headers.append(("transfer-encoding", "chunked"))
            cut = draw(st.integers(0, len(payload)))
            parts = [payload[:cut], payload[cut:]]
            payload = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
        head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        return RawRequest(head.encode("latin-1") + payload, path, method)

    return build()


def send_raw(port: int, data: bytes, within: float = 30.0, *, head: bool = False) -> list[Reply]:
    """Send `data` and read the answers: until the server closes, or until it has been quiet
    for a moment after a complete answer (the servers under fuzz close stalled requests and
    idle connections within seconds: `FUZZ_LIMITS`).

    `head`: the first request is a HEAD, whose answer has a Content-Length but no body.
    """
    seen = b""
    deadline = time.monotonic() + within
    with socket.create_connection(("127.0.0.1", port), timeout=within) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server neither answered nor closed within {within}s")
            s.settimeout(_QUIET if _answered(seen, head) else max(0.01, deadline - time.monotonic()))
            try:
                got = s.recv(65536)
            except TimeoutError:
                if _answered(seen, head):
                    break
                continue
            except ConnectionResetError:
                break
            if not got:
                break
            seen += got
    replies: list[Reply] = []
    rest = seen
    while rest.startswith(b"HTTP/1.1 1"):  # interim answers (100 Continue) carry no body
        rest = rest[rest.find(b"\r\n\r\n") + 4 :]
    if head and rest.startswith(b"HTTP/"):
        end = rest.find(b"\r\n\r\n")
        assert end > 0, f"a partial head answering HEAD: {rest[:400]!r}"
        replies.append(Reply(status=int(rest[9:12]), complete=True, head_only=True))
        closing = b"connection: close" in rest[:end].lower()
        rest = rest[end + 4 :]
        if closing and not rest.startswith(b"HTTP/"):
            # A request rejected before it was known to be a HEAD may carry its error body;
            # the connection closes after it, so no client mistakes it for another answer.
            rest = b""
    c = _Collect()
    try:
        c.parser.feed_data(rest)
    except httptools.HttpParserError as exc:
        raise AssertionError(f"not HTTP ({exc}): {seen[:400]!r} answering {data[:400]!r}") from None
    return replies + [r for r in c.replies if r.complete and r.status >= 200]


_QUIET = 0.1  # seconds of silence after a complete answer that end the reading


def _answered(seen: bytes, head: bool) -> bool:
    """Whether `seen` holds at least one complete final answer."""
    rest = seen
    while rest.startswith(b"HTTP/1.1 1"):
        rest = rest[rest.find(b"\r\n\r\n") + 4 :]
    if head:
        return b"\r\n\r\n" in rest
    c = _Collect()
    try:
        c.parser.feed_data(rest)
    except httptools.HttpParserError:
        return True  # not HTTP: the caller's parse reports it
    return any(r.complete and r.status >= 200 for r in c.replies)


# Short timeouts for servers under fuzz: a request the fuzzer left unfinished is closed soon.
FUZZ_LIMITS = {"header_timeout": 2.0, "idle_timeout": 2.0}


# ------------------------------------------------------------------ checks


def check_reply(reply: Reply) -> None:
    """No 5xx; every 4xx carries a well-formed error body: `{"error": {"message", "type", ...}}`,
    which both OpenAI's shape and Anthropic's (`{"type": "error", "error": {...}}`) are."""
    assert reply.status < 500, f"{reply.status}: {reply.body[:500]!r}"
    if reply.status < 400 or reply.head_only:
        return
    try:
        err = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        raise AssertionError(f"{reply.status} without a JSON body: {reply.body[:300]!r}") from None
    assert isinstance(err, dict) and isinstance(err.get("error"), dict), err
    assert isinstance(err["error"].get("message"), str) and err["error"]["message"], err
    assert isinstance(err["error"].get("type"), str), err
