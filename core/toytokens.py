"""The builtin engine's deterministic toy tokenizer and chat template.

In `core` because the coordinator computes a prompt's KV block hashes the way the builtin
engine does (`core.kvblocks`); the engine imports it through `simengine.tokenizer`.

A token is a word or one punctuation mark together with the whitespace before it, so the
tokens of a text concatenate back to the text. Token ids given by a client (`prompt` as a
list of ints) are used as they are. Counts only need to be stable and plausible, not BPE.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

Token = str | int

_TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class TemplateError(ValueError):
    """Chat messages that do not have the shape of the OpenAI chat API."""


def tokenize(text: str) -> list[str]:
    """Split text into tokens that concatenate back to it."""
    return _TOKEN_RE.findall(text)


@lru_cache(maxsize=1 << 16)  # a word list's vocabulary: each word is hashed once
def _word_id(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little") >> 1


def token_id(token: Token) -> int:
    """A token's id: ints are ids already; a word gets a stable 31-bit id from its text.

    Stable across processes (Python's str hash is salted per process), so the ids the engine
    publishes in its KV events are the ids the coordinator computes for a prompt.
    """
    return token if isinstance(token, int) else _word_id(token)


def token_ids(tokens: Sequence[Token]) -> list[int]:
    """`token_id` of each token."""
    word = _word_id
    return [t if isinstance(t, int) else word(t) for t in tokens]


def count_tokens(text: str) -> int:
    """How many tokens `tokenize(text)` would return."""
    return len(_TOKEN_RE.findall(text))


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise TemplateError(f"{where}.content[{i}] must be an object with a 'type'")
            kind = part["type"]
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise TemplateError(f"{where}.content[{i}].text must be a string")
                parts.append(text)
            else:
                # Images, audio and files cost tokens in a real model; one placeholder each.
                parts.append(f"<{kind}>")
        return "".join(parts)
    raise TemplateError(f"{where}.content must be a string or a list of content parts")


def render_chat(
    messages: Sequence[Any], add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """Apply the builtin chat template: one `<|role|>` header and body per message.

    With `continue_final_message` the last message is left open, so generation goes on inside
    it (how a broken stream is continued elsewhere).
    """
    if add_generation_prompt and continue_final_message:
        raise TemplateError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if not isinstance(messages, list | tuple) or not messages:
        raise TemplateError("messages must be a non-empty list")
    out: list[str] = []
    for i, msg in enumerate(messages):
        if type(msg) is dict and len(msg) == 2:
            # The common shape, {"role": ..., "content": "..."}, without the general checks.
            role, content = msg.get("role"), msg.get("content")
            if type(content) is str and type(role) is str and role in CHAT_ROLES:
                out.append(f"<|{role}|>\n{content}\n")
                continue
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise TemplateError(f"{where} must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise TemplateError(f"{where}.role must be one of {sorted(CHAT_ROLES)}, got {role!r}")
        text = _content_text(msg.get("content"), where)
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    fn = {}
                text += f"<tool_call>{fn.get('name', '')} {fn.get('arguments', '')}"
        out.append(f"<|{role}|>\n{text}\n")
    if continue_final_message:
        out[-1] = out[-1][:-1]
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)
