"""The builtin engine's OpenAI API through the official `openai` SDK, against real processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import orjson
import pytest

from tests.integration.builtin_proc import BuiltinEngineProc, http

MODEL = "motor-sim"
MSGS = [{"role": "user", "content": "Explain prefill/decode disaggregation in one paragraph."}]


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinEngineProc]:
    """A union engine on the clock (quick speeds so tests stay short)."""
    args = ("--model", MODEL, "--served-model-name", "alias", "--itl-ms", "2", "--ttft-base-ms", "1")
    with BuiltinEngineProc(tmp_path_factory.mktemp("timed"), *args, name="timed") as eng:
        yield eng


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinEngineProc]:
    """A union engine in --fast mode (answers inside the HTTP callback)."""
    with BuiltinEngineProc(
        tmp_path_factory.mktemp("fast"),
        "--model",
        MODEL,
        "--served-model-name",
        "alias",
        "--fast",
        name="fast",
    ) as eng:
        yield eng


@pytest.fixture(params=["timed", "fast"])
def engine(request: pytest.FixtureRequest) -> BuiltinEngineProc:
    eng: BuiltinEngineProc = request.getfixturevalue(request.param)
    return eng


def client(eng: BuiltinEngineProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=eng.url + "/v1", api_key="none", max_retries=0, timeout=30)


def aclient(eng: BuiltinEngineProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=eng.url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_chat_sync_nonstream_shape(engine: BuiltinEngineProc) -> None:
    with client(engine) as c:
        r = c.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, seed=3, temperature=0.7)  # type: ignore[arg-type]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    ch = r.choices[0]
    assert ch.index == 0 and ch.finish_reason == "length" and ch.message.role == "assistant"
    assert ch.message.content and len(ch.message.content.split()) >= 5
    assert r.usage is not None and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert (
        r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens is not None
    )


def test_chat_stream_concatenates_to_the_nonstream_text(engine: BuiltinEngineProc) -> None:
    kw = {"model": MODEL, "messages": MSGS, "max_tokens": 16, "seed": 11, "temperature": 0.9}
    with client(engine) as c:
        whole = c.chat.completions.create(**kw)  # type: ignore[call-overload]
        chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))  # type: ignore[call-overload]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    assert "".join(content) == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert sum(1 for piece in content if piece) == 16
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16
    assert len({ch.id for ch in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(fast: BuiltinEngineProc) -> None:
    with client(fast) as c:
        chunks = list(c.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=4, stream=True))  # type: ignore[arg-type]
    assert all(ch.choices for ch in chunks) and all(ch.usage is None for ch in chunks)


def test_fast_stream_is_chunked_one_event_per_chunk(fast: BuiltinEngineProc) -> None:
    """--fast streams like a real engine: chunked framing, one SSE event per chunk."""
    import socket

    body = orjson.dumps(
        {"model": MODEL, "messages": MSGS, "max_tokens": 16, "ignore_eos": True, "stream": True}
    )
    host, port = fast.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
        )
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower() and b"content-length" not in head.lower()
    events = []
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        events.append(rest[:n])
        rest = rest[n + 2 :]
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") and e.count(b"data: ") == 1 for e in events)
    assert len(events) == 1 + 16 + 1  # role, 16 tokens, [DONE]
    assert events[-1] == b"data: [DONE]\n\n"


def test_continuous_usage_stats(fast: BuiltinEngineProc) -> None:
    with client(fast) as c:
        chunks = list(
            c.completions.create(
                model=MODEL,
                prompt="count",
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            )
        )
    counts = [ch.usage.completion_tokens for ch in chunks[:-1] if ch.usage is not None]
    assert counts == [1, 2, 3, 4, 5]


async def test_async_completions_stream_and_not(engine: BuiltinEngineProc) -> None:
    async with aclient(engine) as c:
        whole = await c.completions.create(
            model=MODEL, prompt="The quick brown fox", max_tokens=20, temperature=0
        )
        stream = await c.completions.create(
            model=MODEL, prompt="The quick brown fox", max_tokens=20, temperature=0, stream=True
        )
        pieces = [ch.choices[0].text async for ch in stream if ch.choices]
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].finish_reason == "length"
    assert "".join(pieces) == whole.choices[0].text
    assert whole.usage is not None and whole.usage.prompt_tokens == 4


async def test_async_chat_concurrent_requests_are_deterministic(timed: BuiltinEngineProc) -> None:
    async with aclient(timed) as c:
        rs = await asyncio.gather(
            *(c.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=8, seed=1) for _ in range(8))  # type: ignore[arg-type]
        )
    assert len({r.choices[0].message.content for r in rs}) == 1


def test_same_request_same_text_across_engines(timed: BuiltinEngineProc, fast: BuiltinEngineProc) -> None:
    kw = {"model": MODEL, "messages": MSGS, "max_tokens": 10, "seed": 5, "temperature": 1.0}
    with client(timed) as a, client(fast) as b:
        assert (
            a.chat.completions.create(**kw).choices[0].message.content  # type: ignore[call-overload]
            == b.chat.completions.create(**kw).choices[0].message.content  # type: ignore[call-overload]
        )


def test_max_completion_tokens_and_served_alias(fast: BuiltinEngineProc) -> None:
    with client(fast) as c:
        r = c.chat.completions.create(model="alias", messages=MSGS, max_completion_tokens=3)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.completion_tokens == 3 and r.model == "alias"


def test_stop_sequence(fast: BuiltinEngineProc) -> None:
    with client(fast) as c:
        full = c.completions.create(model=MODEL, prompt="Stop test", max_tokens=30, temperature=0)
        text = full.choices[0].text
        stop = text.split()[6]
        r = c.completions.create(model=MODEL, prompt="Stop test", max_tokens=30, temperature=0, stop=[stop])
        streamed = c.completions.create(
            model=MODEL, prompt="Stop test", max_tokens=30, temperature=0, stop=[stop], stream=True
        )
        pieces = [(ch.choices[0].text, ch.choices[0].finish_reason) for ch in streamed if ch.choices]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.find(stop)]
    assert "".join(p for p, _ in pieces) == r.choices[0].text and pieces[-1][1] == "stop"


def test_natural_end_without_max_tokens(fast: BuiltinEngineProc) -> None:
    with client(fast) as c:
        r = c.chat.completions.create(model=MODEL, messages=MSGS)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and 64 <= r.usage.completion_tokens <= 256


def test_prefix_caching_reports_cached_tokens(engine: BuiltinEngineProc) -> None:
    long_doc = " ".join(f"word{i}" for i in range(200))
    with client(engine) as c:
        first = c.completions.create(model=MODEL, prompt=long_doc + " first question", max_tokens=2)
        second = c.completions.create(model=MODEL, prompt=long_doc + " second question", max_tokens=2)
    assert first.usage is not None and second.usage is not None
    d1, d2 = first.usage.prompt_tokens_details, second.usage.prompt_tokens_details
    assert d1 is not None and d2 is not None and d2.cached_tokens is not None
    assert d2.cached_tokens >= 192 and d2.cached_tokens % 16 == 0
    assert d2.cached_tokens > (d1.cached_tokens or 0) or (d1.cached_tokens or 0) >= 192


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 2}, openai.BadRequestError),
        ({"temperature": -1}, openai.BadRequestError),
        ({"max_tokens": 100000}, openai.BadRequestError),
        ({"model": "no-such-model"}, openai.NotFoundError),
    ],
)
def test_bad_params_are_openai_errors(
    fast: BuiltinEngineProc, kwargs: dict[str, object], error: type
) -> None:
    req = {"model": MODEL, "messages": MSGS, "max_tokens": 4, **kwargs}
    with client(fast) as c, pytest.raises(error) as err:
        c.chat.completions.create(**req)  # type: ignore[call-overload]
    body = err.value.body  # type: ignore[attr-defined]
    assert (
        isinstance(body, dict) and body["message"] and body["type"] and body["code"] == err.value.status_code
    )  # type: ignore[attr-defined]


def test_models_list(engine: BuiltinEngineProc) -> None:
    with client(engine) as c:
        models = c.models.list().data
    assert [m.id for m in models] == [MODEL, "alias"]
    assert all(m.owned_by == "motor-builtin-simulator" for m in models)


def test_embeddings_float_and_base64(fast: BuiltinEngineProc) -> None:
    with client(fast) as c:
        b64 = c.embeddings.create(model=MODEL, input=["hello world", "other"])  # SDK default: base64
        flt = c.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
    assert len(b64.data) == 2 and len(b64.data[0].embedding) == 64
    assert b64.data[0].embedding == pytest.approx(flt.data[0].embedding, rel=1e-5)
    assert b64.data[0].embedding != b64.data[1].embedding
    assert sum(v * v for v in flt.data[0].embedding) == pytest.approx(1.0, rel=1e-4)
    assert flt.usage.prompt_tokens == 2


def test_embeddings_bad_input(fast: BuiltinEngineProc) -> None:
    status, _, body = http("POST", fast.url + "/v1/embeddings", {"input": [{"x": 1}]})
    assert status == 400 and orjson.loads(body)["error"]["param"] == "input"
