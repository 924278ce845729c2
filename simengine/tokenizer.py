"""The builtin engine's tokenizer and chat template (they live in `core.toytokens`, where the
coordinator's KV-aware routing computes prompts the same way)."""

from __future__ import annotations

from core.toytokens import (
    CHAT_ROLES,
    TemplateError,
    Token,
    count_tokens,
    render_chat,
    token_id,
    token_ids,
    tokenize,
)

__all__ = [
    "CHAT_ROLES",
    "TemplateError",
    "Token",
    "count_tokens",
    "render_chat",
    "token_id",
    "token_ids",
    "tokenize",
]
