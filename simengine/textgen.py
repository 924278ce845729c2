"""Deterministic text: an autoregressive toy model over a word list, plus stop/EOS rules.

Each next token is a pure function of the whole context so far (prompt plus generated text,
whitespace ignored) and the sampling parameters, like greedy decoding of a real model. So:
- a union engine and a prefill/decode pair give the same text for the same request;
- the first k tokens never depend on `max_tokens`;
- a request whose prompt is `prompt + the first k tokens` (a coordinator continuing a broken
  stream, or a chat with `continue_final_message`) goes on with exactly the tokens k+1...
The context is folded with CRC-32 (streamable, one C call for the prompt) and a splitmix64
finalizer, so a token costs well under a microsecond.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from simengine.tokenizer import Token

_WORD_TEXT = """
    the of and to in is that it for as with was on be by at this from are have or an which
    one not but all were when we there can more if will would about so what up out them some
    time these two may then do first any like now my such make over our even most after also
    made many did before must through back years where much your way well down should because
    each just those people how too little state good very world still own see men work long
    here get both between life being under never day same another know while last might great
    old year off come since against go came right used take three himself few house use during
    without again place around however home small found thought went say part once general high
    upon school every does got united left number course war until always away something fact
    though water less public put think almost hand enough far took head yet government system
    better set told nothing night end why called didn find going look asked later knew point
    next program city business give group toward young days let room president side social
    given present several order national possible rather second face per among form important
    often things looked early white case john become large big need four within felt along saw
    best church ever least power development light thing seemed family interest want members
    mind country area others done turned although open problem god service certain kind began
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
_WORDS_B = tuple(w.encode() for w in WORDS)
_CAPS = tuple(w.capitalize() for w in WORDS)
_CAPS_B = tuple(w.encode() for w in _CAPS)

_PUNCT_RATE = 0.08  # a sentence ends about every 12 words
_COMMA_RATE = 0.06
_GARBAGE = (" NaN", " nan", " inf", " \ufffd", " -nan", " <unk>", " 0x7fc00000")


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling parameters that shape the text."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """What a request will emit: one text piece per generated token, and why it ends."""

    pieces: tuple[str, ...]  # pieces concatenate to `text`; a piece may be '' after a stop cut
    text: str
    finish_reason: str  # "stop" | "length"
    stop_reason: str | None
    completion_tokens: int  # len(pieces), kept as a field: it is read on every request


def prompt_digest(tokens: Sequence[Token], text: str | None = None) -> bytes:
    """A stable 16-byte digest of the prompt (the same in every process)."""
    raw = text.encode() if text is not None else "\x1f".join(map(str, tokens)).encode()
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Context:
    """What the next token depends on: the folded context text and how it ends."""

    key: int  # CRC-32 of the context with all whitespace removed
    ends_with_space: bool  # the next word needs no leading space
    capital: bool  # the next word starts a sentence
    no_punct: bool  # punctuation may not come next


def context_of(text: str) -> Context:
    """The context of a prompt text (a completion prompt or a rendered chat)."""
    key = zlib.crc32("".join(text.split()).encode())
    stripped = text.rstrip()
    last = stripped[-1:] if stripped else ""
    ends_line = not stripped or text[len(stripped) :].find("\n") >= 0
    return Context(
        key=key,
        ends_with_space=not text or text[-1].isspace(),
        capital=ends_line or last in ".!?",
        no_punct=ends_line or not (last.isalnum() or last == "_"),
    )


def context_of_ids(ids: Sequence[int]) -> Context:
    """The context of a prompt given as token ids."""
    return Context(zlib.crc32(",".join(map(str, ids)).encode()), True, True, True)


def sampling_key(sampling: Sampling) -> int:
    """64 bits standing for the sampling parameters (greedy ignores the seed, like a real engine)."""
    if sampling.temperature > 0:
        params = struct.pack("<ddq", sampling.temperature, sampling.top_p, sampling.seed or 0)
    else:
        params = b"greedy"
    return int.from_bytes(hashlib.blake2b(params, digest_size=8).digest(), "little")


_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    # splitmix64's finalizer: spreads a context key into 64 well-mixed bits.
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def natural_length(digest: bytes, sampling: Sampling, lo: int, hi: int) -> int:
    """Where the model emits EOS when no max_tokens is given: a stable value in [lo, hi]."""
    if hi <= lo:
        return lo
    return lo + _mix(int.from_bytes(digest[:8], "little") ^ sampling_key(sampling)) % (hi - lo + 1)


def generate(ctx: Context, sampling: Sampling, n: int, garbage: bool = False) -> list[str]:
    """The next `n` token texts after context `ctx`."""
    # Higher temperature samples from more of the vocabulary; greedy stays with the top words.
    pool = min(len(WORDS), 48 + int(sampling.temperature * 200)) if sampling.temperature > 0 else 48
    pool = max(1, int(pool * min(1.0, max(sampling.top_p, 0.01))))
    skey = sampling_key(sampling) & 0xFFFFFFFF
    key, space, capital, no_punct = ctx.key, not ctx.ends_with_space, ctx.capital, ctx.no_punct
    crc = zlib.crc32
    punct_cut = int(_PUNCT_RATE * 65536)
    comma_cut = int((_PUNCT_RATE + _COMMA_RATE) * 65536)
    out: list[str] = []
    append = out.append
    for _ in range(n):
        # Multiplicative hashing of (context, sampling): the high 32 bits are well mixed.
        r = (((key ^ skey) * 0x9E3779B97F4A7C15) >> 32) & 0xFFFFFFFF
        low = r & 0xFFFF
        if not no_punct and low < punct_cut:
            append(".")
            key = crc(b".", key)
            capital = no_punct = True
        elif not no_punct and low < comma_cut:
            append(",")
            key = crc(b",", key)
            no_punct = True
        else:
            i = (r >> 16) % pool
            if capital:
                core, raw = _CAPS[i], _CAPS_B[i]
            else:
                core, raw = WORDS[i], _WORDS_B[i]
            append(" " + core if space else core)
            key = crc(raw, key)
            capital = no_punct = False
        space = True
    if garbage:
        # A precision fault: the shape of the output stays, its content is numerically broken.
        out = [_GARBAGE[(i + len(t)) % len(_GARBAGE)] for i, t in enumerate(out)]
    return out


def _find_stop(tokens: list[str], stops: tuple[str, ...], min_tokens: int) -> tuple[int, int, str] | None:
    """(index of the token that completes a stop, its position in the text, the stop)."""
    longest = max(len(s) for s in stops)
    text = ""
    for i, tok in enumerate(tokens):
        start = max(0, len(text) - longest + 1)
        text += tok
        if i + 1 < min_tokens:
            continue
        best: tuple[int, str] | None = None
        for s in stops:
            pos = text.find(s, start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is not None:
            return i, best[0], best[1]
    return None


@lru_cache(maxsize=4096)
def plan_output(
    ctx: Context,
    sampling: Sampling,
    max_tokens: int,
    natural_len: int,
    garbage: bool = False,
) -> Plan:
    """Decide the whole output of a request up front (timing is applied when emitting it).

    Pure, so memoized: repeated requests (benchmarks, health probes) cost a lookup.
    """
    limit, finish = max_tokens, "length"
    if not sampling.ignore_eos and natural_len < max_tokens:
        limit = max(natural_len, min(sampling.min_tokens, max_tokens))
        if limit < max_tokens:
            finish = "stop"
    tokens = generate(ctx, sampling, limit, garbage)
    stops = tuple(s for s in sampling.stop if s)
    found = _find_stop(tokens, stops, sampling.min_tokens) if stops else None
    if found is None:
        return Plan(tuple(tokens), "".join(tokens), finish, None, len(tokens))
    index, pos, stop = found
    cut = pos + len(stop) if sampling.include_stop_str_in_output else pos
    pieces: list[str] = []
    offset = 0
    for tok in tokens[: index + 1]:
        end = offset + len(tok)
        pieces.append(tok[: max(0, cut - offset)] if end > cut else tok)
        offset = end
    return Plan(tuple(pieces), "".join(pieces), "stop", stop, len(pieces))
