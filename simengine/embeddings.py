"""`/v1/embeddings` of the builtin engine: deterministic unit vectors that depend only on the
input (no model): enough to route, validate and measure embeddings requests end to end."""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from typing import Any

import orjson

from simengine.openai_api import ApiError, check_model
from simengine.tokenizer import count_tokens

MAX_EMBEDDING_DIM = 8192


def embeddings_body(
    body: dict[str, Any], names: tuple[str, ...], default_dim: int, raw: bytes
) -> dict[str, Any]:
    """The `/v1/embeddings` answer to `body` (`raw`: its bytes, which name the answer's id)."""
    model = check_model(body, names)
    inputs = body.get("input")
    if isinstance(inputs, str) or (
        isinstance(inputs, list)
        and inputs
        and all(isinstance(t, int) and not isinstance(t, bool) for t in inputs)
    ):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise ApiError(400, "input must be a string, a list of strings, or token ids", param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(400, "encoding_format must be 'float' or 'base64'", param="encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise ApiError(400, "dimensions must be a positive integer", param="dimensions")
    if dims is not None and dims > MAX_EMBEDDING_DIM:
        # A vector is built and serialised whole: an unbounded size is a memory bomb.
        raise ApiError(400, f"dimensions must be at most {MAX_EMBEDDING_DIM}, got {dims}", param="dimensions")
    dim = dims or default_dim
    data, tokens = [], 0
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            tokens += count_tokens(item)
            key = item.encode()
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            tokens += len(item)
            key = orjson.dumps(item)
        else:
            raise ApiError(400, f"input[{i}] must be a string or a list of token ids", param="input")
        vec = _embedding(key, dim)
        emb: Any = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode() if fmt == "base64" else vec
        data.append({"index": i, "object": "embedding", "embedding": emb})
    return {
        "id": f"embd-{hashlib.md5(raw).hexdigest()}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                  "prompt_tokens_details": None},
    }  # fmt: skip


def _embedding(key: bytes, dim: int) -> list[float]:
    """A unit vector that depends only on the input."""
    raw = b""
    counter = 0
    while len(raw) < dim * 4:
        raw += hashlib.blake2b(key + counter.to_bytes(4, "little"), digest_size=64).digest()
        counter += 1
    ints = struct.unpack(f"<{dim}i", raw[: dim * 4])
    vec = [v / 2147483648.0 for v in ints]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]
