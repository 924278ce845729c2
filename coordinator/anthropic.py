"""Anthropic Messages API ↔ OpenAI chat completions: pure translation, no I/O.

`/v1/messages` bodies become chat bodies for the engines (which speak OpenAI); chat answers
become Anthropic messages; `StreamTranslator` (in `anthropic_stream`) turns chat SSE chunks
into Anthropic stream events. Every bad field is a 400 naming it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from coordinator.anthropic_stream import StreamTranslator, map_stop_reason
from coordinator.errors import CoordinatorError

__all__ = [
    "StreamTranslator",
    "chat_to_message",
    "count_tokens",
    "estimate_tokens",
    "map_stop_reason",
    "messages_to_chat",
]

_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _bad(field: str, message: str) -> CoordinatorError:
    return CoordinatorError(400, f"{field}: {message}", code="invalid_field")


def _text_of(value: Any, field: str) -> str:
    """A string, or the text of a list of text blocks (system prompts, tool results)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise _bad(f"{field}[{i}]", "expected a text block {type: 'text', text: ...}")
            text = block.get("text")
            if not isinstance(text, str):
                raise _bad(f"{field}[{i}].text", "must be a string")
            parts.append(text)
        return "\n".join(parts)
    raise _bad(field, "must be a string or a list of text blocks")


def _image_part(block: dict[str, Any], field: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _bad(f"{field}.source", "is required for an image block")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _bad(f"{field}.source", "a base64 image needs string media_type and data")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str):
            raise _bad(f"{field}.source.url", "must be a string")
        return {"type": "image_url", "image_url": {"url": url}}
    raise _bad(f"{field}.source.type", f"unsupported image source {kind!r} (use base64 or url)")


def _user_messages(content: list[Any], field: str) -> list[dict[str, Any]]:
    """One Anthropic user turn: tool results become `tool` messages (first), the rest one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        f = f"{field}[{i}]"
        if not isinstance(block, dict):
            raise _bad(f, "must be a content block object")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _bad(f"{f}.text", "must be a string")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image_part(block, f))
        elif kind == "tool_result":
            tid = block.get("tool_use_id")
            if not isinstance(tid, str):
                raise _bad(f"{f}.tool_use_id", "must be a string")
            raw = block.get("content", "")
            text = _text_of(raw, f"{f}.content") if raw != [] else ""
            if block.get("is_error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": tid, "content": text})
        elif kind == "document":
            source = block.get("source")
            if not isinstance(source, dict) or source.get("type") != "text":
                raise _bad(f"{f}.source", "only text documents are supported")
            parts.append({"type": "text", "text": str(source.get("data", ""))})
        else:
            raise _bad(f"{f}.type", f"unsupported content block {kind!r} in a user turn")
    out = list(tools)
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant_message(content: list[Any], field: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        f = f"{field}[{i}]"
        if not isinstance(block, dict):
            raise _bad(f, "must be a content block object")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _bad(f"{f}.text", "must be a string")
            texts.append(block["text"])
        elif kind == "tool_use":
            tid, name = block.get("id"), block.get("name")
            if not isinstance(tid, str) or not isinstance(name, str):
                raise _bad(f, "a tool_use block needs string id and name")
            args = orjson.dumps(block.get("input", {})).decode()
            calls.append({"id": tid, "type": "function", "function": {"name": name, "arguments": args}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the engine cannot use another model's reasoning
        else:
            raise _bad(f"{f}.type", f"unsupported content block {kind!r} in an assistant turn")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if "system" in body and body["system"] is not None:
        out.append({"role": "system", "content": _text_of(body["system"], "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "is required and must be a non-empty list")
    for i, m in enumerate(messages):
        f = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f, "must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise _bad(f"{f}.role", f"must be 'user' or 'assistant', got {role!r}")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            if role == "user":
                out.extend(_user_messages(content, f"{f}.content"))
            else:
                out.append(_assistant_message(content, f"{f}.content"))
        else:
            raise _bad(f"{f}.content", "must be a string or a list of content blocks")
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    out = []
    for i, t in enumerate(tools):
        f = f"tools[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _bad(f"{f}.name", "is required and must be a string")
        if t.get("type") not in (None, "custom"):
            raise _bad(f"{f}.type", f"server tool {t.get('type')!r} is not supported")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(f"{f}.input_schema", "is required and must be a JSON schema object")
        fn: dict[str, Any] = {"name": t["name"], "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise _bad("tool_choice", "must be an object with a type")
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _bad("tool_choice.name", "is required when type is 'tool'")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in _TOOL_CHOICE:
        chat["tool_choice"] = _TOOL_CHOICE[kind]
    else:
        raise _bad("tool_choice.type", f"must be auto, any, tool or none, got {kind!r}")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise _bad(name, f"must be a number in [{lo}, {hi}]")
    return value


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic `/v1/messages` body as an OpenAI `/v1/chat/completions` body."""
    if not isinstance(body, dict):
        raise _bad("body", "must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "is required and must be a string")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _bad("max_tokens", "is required and must be an integer >= 1")
    chat: dict[str, Any] = {"model": model, "messages": _messages(body), "max_tokens": max_tokens}
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = _number(body, name, lo, hi)
        if value is not None:
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise _bad("top_k", "must be an integer >= 0")
        chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _bad("stop_sequences", "must be a list of strings")
        if stops:
            chat["stop"] = stops
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # message_delta reports output_tokens
    if body.get("tools"):
        chat["tools"] = _tools(body)
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    return chat


def message_id(chat_id: str | None) -> str:
    """An Anthropic-style message id from a chat completion id."""
    if not chat_id:
        return "msg_motor"
    return "msg_" + chat_id.removeprefix("chatcmpl-").removeprefix("cmpl-")


def _tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or "{}"
    try:
        parsed = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        parsed = {"_raw": raw}  # the engine produced broken JSON: keep it visible, do not fail
    if not isinstance(parsed, dict):
        parsed = {"value": parsed}
    return {
        "type": "tool_use",
        "id": call.get("id") or "toolu_motor",
        "name": fn.get("name", ""),
        "input": parsed,
    }


def chat_to_message(resp: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat completion (non-streaming) as an Anthropic message."""
    choices = resp.get("choices") or [{}]
    choice = choices[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = msg.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in msg.get("tool_calls") or ():
        content.append(_tool_use_block(call))
    stop_reason, stop_sequence = map_stop_reason(choice.get("finish_reason"), choice.get("stop_reason"))
    usage = resp.get("usage") or {}
    return {
        "id": message_id(resp.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


# A rough tokenizer for count_tokens: the coordinator has no model tokenizer, so it counts
# word pieces of ~4 characters, punctuation marks and CJK characters one token each.
_PIECES = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|[^\W_]+|[^\w\s]|_+", re.UNICODE)
_PER_MESSAGE = 3  # role and separators, as chat templates add them
_PER_IMAGE = 85


def estimate_tokens(text: str) -> int:
    """Estimated token count of a text (about 4 characters a word piece)."""
    n = 0
    for m in _PIECES.finditer(text):
        piece = m.group()
        n += math.ceil(len(piece) / 4) if len(piece) > 1 else 1
    return n


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """`/v1/messages/count_tokens`: an estimate of the prompt's input tokens (`{"input_tokens": n}`)."""
    if not isinstance(body, dict):
        raise _bad("body", "must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model", "is required and must be a string")
    messages = _messages(body)
    total = 3  # the assistant turn the template opens for the reply
    for m in messages:
        total += _PER_MESSAGE
        content = m.get("content")
        if isinstance(content, str):
            total += estimate_tokens(content)
        elif isinstance(content, list):
            for part in content:
                total += estimate_tokens(part["text"]) if part["type"] == "text" else _PER_IMAGE
        for call in m.get("tool_calls") or ():
            total += estimate_tokens(call["function"]["name"]) + estimate_tokens(
                call["function"]["arguments"]
            )
    if body.get("tools"):
        total += estimate_tokens(orjson.dumps(_tools(body)).decode())
    return {"input_tokens": total}
