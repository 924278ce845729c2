"""The builtin engine answers seed 003's client routes the way SGLang and vLLM do."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import orjson
import pytest

from tests.integration.builtin_proc import BuiltinEngineProc, http

PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module", params=["--fast", "--itl-ms=1"])
def eng(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BuiltinEngineProc]:
    with BuiltinEngineProc(tmp_path_factory.mktemp("native"), request.param, name="native") as e:
        yield e


def post(eng: BuiltinEngineProc, path: str, body: object) -> tuple[int, object]:
    status, _, raw = http("POST", eng.url + path, body)
    return status, orjson.loads(raw)


def sse(raw: bytes) -> list[bytes]:
    return [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


def test_generate_is_sglang_native_and_says_what_completions_says(eng: BuiltinEngineProc) -> None:
    status, comp = post(eng, "/v1/completions", {"prompt": PROMPT, "max_tokens": 7, "temperature": 0})
    assert status == 200 and isinstance(comp, dict)
    status, gen = post(
        eng,
        "/generate",
        {"text": PROMPT, "sampling_params": {"max_new_tokens": 7, "temperature": 0}, "rid": "g1"},
    )
    assert status == 200 and isinstance(gen, dict)
    assert gen["text"] == comp["choices"][0]["text"]
    meta = gen["meta_info"]
    assert meta["id"] == "g1" and meta["finish_reason"] == {"type": "length", "length": 7}
    assert meta["completion_tokens"] == 7 and meta["prompt_tokens"] == comp["usage"]["prompt_tokens"]

    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 7, "temperature": 0}, "stream": True}
    status, headers, raw = http("POST", eng.url + "/generate", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # the text so far, growing
    assert texts[-1] == gen["text"] and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_refuses_a_body_without_text(eng: BuiltinEngineProc) -> None:
    status, err = post(eng, "/generate", {"sampling_params": {}})
    assert status == 400 and isinstance(err, dict) and err["error"]["param"] == "text"


def test_tokenize_and_detokenize_round_trip(eng: BuiltinEngineProc) -> None:
    status, tok = post(eng, "/tokenize", {"model": "motor-sim", "prompt": "Hello, internationalization!"})
    assert status == 200 and isinstance(tok, dict)
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 8192
    status, detok = post(eng, "/detokenize", {"model": "motor-sim", "tokens": tok["tokens"]})
    assert status == 200 and detok == {"prompt": "Hello, internationalization!"}
    status, chat = post(eng, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and isinstance(chat, dict) and chat["count"] > 1
    status, err = post(eng, "/detokenize", {"tokens": [5]})
    assert status == 400 and isinstance(err, dict) and "tokens[0]" in err["error"]["message"]
    status, err = post(eng, "/tokenize", {"model": "other", "prompt": "x"})
    assert status == 404


def test_score_in_sglang_and_vllm_shapes_and_rerank(eng: BuiltinEngineProc) -> None:
    status, sg = post(eng, "/v1/score", {"query": "q", "items": ["a", "b"], "label_token_ids": [1, 2]})
    assert status == 200 and isinstance(sg, dict) and len(sg["scores"]) == 2 and len(sg["scores"][0]) == 2
    status, vl = post(eng, "/v1/score", {"text_1": "q", "text_2": ["a", "b", "c"]})
    assert status == 200 and isinstance(vl, dict) and [d["index"] for d in vl["data"]] == [0, 1, 2]
    assert all(0 <= d["score"] < 1 for d in vl["data"])
    docs = ["alpha", "beta", "gamma", "delta"]
    status, rr = post(eng, "/v1/rerank", {"query": "q", "documents": docs, "top_n": 3})
    assert status == 200 and isinstance(rr, dict) and len(rr["results"]) == 3
    scores = [r["relevance_score"] for r in rr["results"]]
    assert scores == sorted(scores, reverse=True)
    assert rr["results"][0]["document"]["text"] == docs[rr["results"][0]["index"]]
    status, again = post(eng, "/v1/rerank", {"query": "q", "documents": docs, "top_n": 3})
    assert again["results"] == rr["results"]  # type: ignore[index]  # deterministic
    status, err = post(eng, "/v1/rerank", {"query": "q"})
    assert status == 400 and isinstance(err, dict) and err["error"]["param"] == "documents"
