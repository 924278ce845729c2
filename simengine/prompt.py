"""What the engine needs to know about a prompt: length, digest, text context, block hashes.

All of it is a pure function of the prompt, so it is memoized: a router benchmark (or a chat
front end) sends the same prompts again and again, and tokenizing and hashing them is most of
the CPU a request costs in `--fast` mode. Very long prompts are not memoized, to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simengine.kvcache import block_hashes
from simengine.textgen import Context, context_of, context_of_ids, prompt_digest
from simengine.tokenizer import Token, tokenize

_MEMO_MAX_CHARS = 16384


@dataclass(frozen=True, slots=True)
class PromptInfo:
    """A prompt as the engine sees it."""

    length: int  # tokens
    digest: bytes  # stable across processes: P/D peers compare it
    ctx: Context  # what the first generated token depends on
    hashes: tuple[int, ...]  # chained hashes of its full KV blocks (this process only)
    tokens: tuple[Token, ...]  # what KV events say the blocks hold


def _of_text(text: str, block_size: int) -> PromptInfo:
    tokens = tokenize(text)
    return PromptInfo(
        len(tokens),
        prompt_digest(tokens, text),
        context_of(text),
        tuple(block_hashes(tokens, block_size)),
        tuple(tokens),
    )


def _of_ids(ids: tuple[int, ...], block_size: int) -> PromptInfo:
    return PromptInfo(
        len(ids), prompt_digest(ids), context_of_ids(ids), tuple(block_hashes(ids, block_size)), ids
    )


_memo_text = lru_cache(maxsize=4096)(_of_text)
_memo_ids = lru_cache(maxsize=1024)(_of_ids)


def analyze(text: str | None, ids: tuple[int, ...] | None, block_size: int) -> PromptInfo:
    """The prompt's info, from its text or (when given as token ids) its ids."""
    if text is not None:
        return _memo_text(text, block_size) if len(text) <= _MEMO_MAX_CHARS else _of_text(text, block_size)
    assert ids is not None
    return _memo_ids(ids, block_size) if len(ids) <= _MEMO_MAX_CHARS // 4 else _of_ids(ids, block_size)
