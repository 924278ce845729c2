"""The engine-native routes a client of SGLang or vLLM calls (seed 003): generate, score, rerank,
tokenize, detokenize.

- `POST /generate` (SGLang native): `{"text" | "input_ids", "sampling_params": {max_new_tokens,
  temperature, top_p, stop, ignore_eos, min_new_tokens, seed}, "stream", "rid"}` ->
  `{"text", "output_ids", "meta_info": {id, finish_reason: {type, length|matched},
  prompt_tokens, completion_tokens, cached_tokens}}`; streamed, each event carries the
  text so far (SGLang's default), then `data: [DONE]`. The text is the same as
  `/v1/completions` with the same prompt and sampling.
- `POST /v1/score`: SGLang's shape (`query`, `items`, `label_token_ids`) -> `{"scores": [[...]]}`,
  or vLLM's (`text_1`, `text_2`) -> `{"data": [{"index", "object": "score", "score"}]}`.
- `POST /v1/rerank` (vLLM / Jina / Cohere shape): `query`, `documents`, `top_n` ->
  `{"results": [{"index", "document": {"text"}, "relevance_score"}]}`, best first.
- `POST /tokenize`, `/detokenize` (vLLM): `{"prompt"}` or `{"messages"}` ->
  `{"count", "max_model_len", "tokens", "token_strs"}`; `{"tokens"}` -> `{"prompt"}`.
  A token id encodes the token's UTF-8 bytes (a token longer than 7 bytes takes several
  ids), so any engine detokenizes what any other tokenized.
Scores are a deterministic function of the texts, in [0, 1).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any

import orjson

from http1.request import Request
from simengine.generation import Generator
from simengine.openai_api import ApiError, check_model, parse_completion, parse_json
from simengine.router import HandlerResult, Response, json_response
from simengine.tokenizer import TemplateError, count_tokens, render_chat, tokenize

PIECE = 7  # bytes of one token id: the marker byte keeps ids below 2**64 (JSON-safe for orjson)
_MARKER = b"\x01"


def encode_ids(text: str) -> list[int]:
    """Token ids of `text`: each token's UTF-8 bytes, 7 a piece, behind a marker byte."""
    ids = []
    for token in tokenize(text):
        raw = token.encode()
        for i in range(0, len(raw), PIECE):
            ids.append(int.from_bytes(_MARKER + raw[i : i + PIECE], "big"))
    return ids


def decode_ids(ids: list[Any]) -> str:
    """The text of ids made by `encode_ids`; a 400 naming the first id that is not one."""
    out = bytearray()
    for i, tid in enumerate(ids):
        if not isinstance(tid, int) or isinstance(tid, bool) or tid <= 0:
            raise ApiError(400, f"tokens[{i}] must be a positive integer, got {tid!r}", param="tokens")
        raw = tid.to_bytes((tid.bit_length() + 7) // 8, "big")
        if not raw.startswith(_MARKER) or len(raw) > PIECE + 1:
            raise ApiError(400, f"tokens[{i}]: {tid} is not a token id of this model", param="tokens")
        out += raw[1:]
    return out.decode(errors="replace")


def score_of(a: str, b: str) -> float:
    """A stable relevance in [0, 1) of `b` to `a`."""
    digest = hashlib.blake2b(f"{a}\x1f{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _texts(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ApiError(400, f"{param} must be a string or a non-empty list of strings", param=param)


class NativeApi:
    """The handlers; `gen` is the engine's generator, `names` the served model names."""

    def __init__(self, gen: Generator, names: tuple[str, ...], max_model_len: int) -> None:
        self.gen = gen
        self.names = names
        self.max_model_len = max_model_len

    def routes(self) -> list[tuple[str, str, Any]]:
        """(method, path, handler) of every route here."""
        return [
            ("POST", "/generate", self.generate),
            ("POST", "/v1/score", self.score),
            ("POST", "/v1/rerank", self.rerank),
            ("POST", "/tokenize", self.tokenize),
            ("POST", "/detokenize", self.detokenize),
        ]

    # ------------------------------------------------------------------ generate

    def generate(self, req: Request) -> HandlerResult:
        body = parse_json(req.body)
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise ApiError(400, "sampling_params must be an object", param="sampling_params")
        if body.get("text") is not None:
            prompt: Any = body["text"]
        elif body.get("input_ids") is not None:
            prompt = body["input_ids"]
        else:
            raise ApiError(400, "text or input_ids is required", param="text")
        stream = body.get("stream") is True
        completion: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": sp.get("max_new_tokens"),
            "temperature": sp.get("temperature"),
            "top_p": sp.get("top_p"),
            "stop": sp.get("stop"),
            "ignore_eos": sp.get("ignore_eos"),
            "min_tokens": sp.get("min_new_tokens"),
            "seed": sp.get("seed"),
            "stream": stream,
            "rid": body.get("rid"),
            "model": body.get("model"),
        }
        for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room", "kv_transfer_params"):
            completion[key] = body.get(key)  # P/D: SGLang's bootstrap (and vLLM's handoff) fields
        if stream:
            completion["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        g = parse_completion(
            {k: v for k, v in completion.items() if v is not None}, self.names, req.header(b"x-request-id")
        )
        result = self.gen.handle(g)
        if stream:
            return self._stream(g.rid, result)
        return self._whole(g.rid, result)

    async def _resolve(self, result: HandlerResult) -> Response:
        return await result if isinstance(result, Awaitable) else result

    async def _whole(self, rid: str, result: HandlerResult) -> Response:
        resp = await self._resolve(result)
        if resp.status != 200:
            return resp
        data = orjson.loads(resp.body)
        choice, use = data["choices"][0], data.get("usage") or {}
        return json_response(
            {
                "text": choice["text"],
                "output_ids": encode_ids(choice["text"]),
                "meta_info": _meta(rid, choice, use),
            }
        )

    async def _stream(self, rid: str, result: HandlerResult) -> Response:
        resp = await self._resolve(result)
        if resp.status != 200:
            return resp

        async def events() -> AsyncIterator[bytes]:
            text, pending = "", b""
            parts = _parts(resp)
            try:
                async for part in parts:
                    pending += part
                    while b"\n\n" in pending:
                        event, pending = pending.split(b"\n\n", 1)
                        out, text = _sglang_event(rid, event, text)
                        if out:
                            yield out
            finally:
                await parts.aclose()  # a client that left stops the engine's stream too

        return Response(200, content_type="text/event-stream", stream=events(), on_sent=resp.on_sent)

    # ------------------------------------------------------------------ score, rerank

    def score(self, req: Request) -> Response:
        body = parse_json(req.body)
        model = check_model(body, self.names)
        if "query" in body or "items" in body:  # SGLang
            query = body.get("query")
            if not isinstance(query, str):
                raise ApiError(400, "query must be a string", param="query")
            items = _texts(body.get("items"), "items")
            labels = body.get("label_token_ids") or [0]
            if not isinstance(labels, list) or not all(isinstance(t, int) for t in labels):
                raise ApiError(400, "label_token_ids must be a list of token ids", param="label_token_ids")
            scores = [[score_of(f"{query}{item}", str(t)) for t in labels] for item in items]
            if body.get("apply_softmax"):
                scores = [[s / sum(row) for s in row] if sum(row) else row for row in scores]
            tokens = count_tokens(query) * len(items) + sum(count_tokens(i) for i in items)
            return json_response(
                {"scores": scores, "model": model, "object": "scoring", "usage": _use(tokens)}
            )
        left = _texts(body.get("text_1"), "text_1")
        right = _texts(body.get("text_2"), "text_2")
        if len(left) == 1:
            left = left * len(right)
        if len(left) != len(right):
            raise ApiError(
                400, "text_1 and text_2 must have the same length, or text_1 one item", param="text_1"
            )
        data = [
            {"index": i, "object": "score", "score": score_of(a, b)}
            for i, (a, b) in enumerate(zip(left, right, strict=True))
        ]
        tokens = sum(count_tokens(a) + count_tokens(b) for a, b in zip(left, right, strict=True))
        return json_response(
            {"id": _id("score", req.body), "object": "list", "created": int(time.time()), "model": model,
             "data": data, "usage": _use(tokens)}
        )  # fmt: skip

    def rerank(self, req: Request) -> Response:
        body = parse_json(req.body)
        model = check_model(body, self.names)
        query = body.get("query")
        if not isinstance(query, str):
            raise ApiError(400, "query must be a string", param="query")
        docs = body.get("documents")
        if isinstance(docs, list):
            docs = [d.get("text") if isinstance(d, dict) else d for d in docs]
        texts = _texts(docs, "documents")
        top_n = body.get("top_n") or len(texts)
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
            raise ApiError(400, "top_n must be a positive integer", param="top_n")
        ranked = sorted(range(len(texts)), key=lambda i: -score_of(query, texts[i]))[:top_n]
        results = [
            {"index": i, "document": {"text": texts[i]}, "relevance_score": score_of(query, texts[i])}
            for i in ranked
        ]
        tokens = count_tokens(query) * len(texts) + sum(count_tokens(t) for t in texts)
        return json_response(
            {
                "id": _id("rerank", req.body),
                "model": model,
                "usage": {"total_tokens": tokens},
                "results": results,
            }
        )

    # ------------------------------------------------------------------ tokenize

    def tokenize(self, req: Request) -> Response:
        body = parse_json(req.body)
        check_model(body, self.names)
        if body.get("messages") is not None:
            try:
                text = render_chat(body["messages"], body.get("add_generation_prompt", True) is True)
            except TemplateError as exc:
                raise ApiError(400, str(exc), param="messages") from None
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise ApiError(400, "prompt (a string) or messages is required", param="prompt")
            text = prompt
        ids = encode_ids(text)
        strs = [decode_ids([t]) for t in ids] if body.get("return_token_strs") else None
        return json_response(
            {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}
        )

    def detokenize(self, req: Request) -> Response:
        body = parse_json(req.body)
        check_model(body, self.names)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError(400, "tokens must be a list of token ids", param="tokens")
        return json_response({"prompt": decode_ids(tokens)})


def _meta(rid: str, choice: dict[str, Any], use: dict[str, Any]) -> dict[str, Any]:
    reason = choice.get("finish_reason")
    finish: dict[str, Any] | None = None
    if reason == "length":
        finish = {"type": "length", "length": use.get("completion_tokens", 0)}
    elif reason is not None:
        finish = {"type": reason, "matched": choice.get("stop_reason")}
    cached = (use.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": use.get("prompt_tokens", 0),
        "completion_tokens": use.get("completion_tokens", 0),
        "cached_tokens": cached,
    }


def _sglang_event(rid: str, event: bytes, text: str) -> tuple[bytes, str]:
    """One OpenAI completion SSE event as SGLang's (the text so far), and the new text so far."""
    if not event.startswith(b"data: "):
        return b"", text
    payload = event[len(b"data: ") :]
    if payload == b"[DONE]":
        return b"data: [DONE]\n\n", text
    chunk = orjson.loads(payload)
    if not chunk.get("choices"):
        return b"", text  # the usage-only chunk: usage already rides on every event
    choice = chunk["choices"][0]
    text += choice.get("text") or ""
    out = {"text": text, "meta_info": _meta(rid, choice, chunk.get("usage") or {}), "index": 0}
    return b"data: " + orjson.dumps(out) + b"\n\n", text


def _use(tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


def _id(kind: str, body: bytes) -> str:
    return f"{kind}-{hashlib.md5(body).hexdigest()}"


async def _parts(resp: Response) -> AsyncGenerator[bytes, None]:
    if resp.parts is not None:
        for part in resp.parts:
            yield part
    elif resp.stream is not None:
        try:
            async for part in resp.stream:
                yield part
        finally:
            aclose = getattr(resp.stream, "aclose", None)
            if aclose is not None:
                await aclose()
    elif resp.body:
        yield resp.body
