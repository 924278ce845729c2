"""A request's prompt as the token ids the builtin engine caches, for KV-aware routing.

The builtin engine renders chat messages with its template and tokenizes the text with its toy
tokenizer (`core.toytokens`); a prompt given as token ids is used as it is, by any engine. A
real engine's tokenizer is not in the coordinator, so for vLLM only token-id prompts can be
matched (docs/architecture.md, "KV-aware routing").
"""

from __future__ import annotations

from typing import Any

from core.toytokens import TemplateError, render_chat, token_ids, tokenize


def _ids_of(prompt: Any) -> list[int] | None:
    if isinstance(prompt, str):
        return token_ids(tokenize(prompt))
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:  # a batch of one
        return _ids_of(prompt[0])
    return None


def builtin_prompt_ids(body: dict[str, Any]) -> list[int] | None:
    """The prompt's token ids as the builtin engine sees them; None when it cannot tell."""
    messages = body.get("messages")
    if messages is not None:
        cont = body.get("continue_final_message") is True
        gen = body.get("add_generation_prompt", not cont) is True
        try:
            return token_ids(tokenize(render_chat(messages, gen, cont)))
        except (TemplateError, AttributeError, TypeError):
            return None
    return _ids_of(body.get("prompt"))


def given_token_ids(body: dict[str, Any]) -> list[int] | None:
    """The prompt when the client gave it as token ids (what any engine caches as they are)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    return None
