"""A whole answer asked of the engine as a stream, folded back into one JSON body, pure.

A whole (`stream: false`) answer whose engine dies midway used to be generated again from its
start: its stall was up to one whole generation. When the answer may be long (its token
budget unset or at least `coordinator.continue_whole_from_tokens`), the coordinator asks the
engine for a stream instead (`streamed_body`, usage in every chunk), folds the chunks into the
body the engine would have answered whole (`WholeFold`), and when the engine dies midway the
fold's text so far is continued elsewhere like a broken stream (`continuation.py`); the
client sees one JSON body either way. Short answers keep the plain whole path: regenerating
them is cheap, and folding costs a stream parse per request on the JSON hot path.
"""

from __future__ import annotations

from typing import Any

import orjson

from coordinator.proxy.continuation import DONE, MAX_EVENT, EventSplitter, Progress, refused_by

STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def streamed_body(chat: bool, body: dict[str, Any], from_tokens: int) -> dict[str, Any] | None:
    """The body that asks the engine for this whole answer as a stream, when it is worth
    continuing on a failure; None: the plain whole path (short, or not continuable)."""
    budget = body.get("max_completion_tokens") if chat else None
    if budget is None:
        budget = body.get("max_tokens")
    if isinstance(budget, int) and budget < from_tokens:
        return None  # the hot path: a short answer is regenerated, never folded
    if body.get("stream_options") or refused_by(body) is not None:
        return None
    if chat:
        if not isinstance(body.get("messages"), list):
            return None
    elif not isinstance(body.get("prompt"), str):
        return None
    out = dict(body)
    out["stream"] = True
    out["stream_options"] = dict(STREAM_OPTIONS)
    return out


class WholeFold:
    """Folds the SSE chunks of one answer, over every continuation of it, into one body.

    Each engine exchange is a segment; `cut()` ends one that broke. Token counts come from the
    chunks' usage (`continuous_usage_stats`) when the engine sends it, else one a text chunk.
    The usage of the folded body is the first segment's prompt (the client's prompt) and every
    segment's completion tokens.
    """

    __slots__ = (
        "chat",
        "continuable",
        "created",
        "error",
        "events",
        "extra",
        "fingerprint",
        "finish",
        "id",
        "last_usage",
        "model",
        "parts",
        "prior",
        "prompt_details",
        "prompt_tokens",
        "reasoning",
        "reasoning_key",
        "seg_counted",
        "seg_tokens",
        "segment",
    )

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.events = EventSplitter()
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key = "reasoning_content"
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.fingerprint: Any = None
        self.finish: str | None = None
        self.extra: dict[str, Any] = {}  # the last choice's other fields (vLLM's stop_reason ...)
        self.error: dict[str, Any] | None = None  # an error event the engine sent mid-stream
        self.continuable = True  # False once the answer holds what a continuation cannot carry
        self.prompt_tokens: int | None = None  # the client's prompt, from the first segment
        self.prompt_details: Any = None
        self.last_usage: dict[str, Any] | None = None
        self.prior = 0  # completion tokens of the segments before this one
        self.seg_tokens: int | None = None  # this segment's completion tokens, from its usage
        self.seg_counted = 0  # ... counted one a text chunk (an engine without usage)
        self.segment = 0

    # ------------------------------------------------------------------ input

    def feed(self, data: bytes) -> None:
        """Decoded body bytes of the engine's stream in."""
        for ev in self.events.feed(data):
            if ev.strip() == DONE:
                continue
            try:
                obj = orjson.loads(ev)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                self._event(obj)
        if self.events.dropped and self.error is None:
            # Text was lost with it: the fold is no longer the engine's answer.
            msg = f"the engine sent a stream event over {MAX_EVENT >> 20} MiB"
            self.error = {"message": msg, "type": "upstream_error", "code": 502}

    def _event(self, obj: dict[str, Any]) -> None:
        err = obj.get("error")
        if isinstance(err, dict):
            self.error = err
            return
        if self.id is None and isinstance(obj.get("id"), str):
            self.id = obj["id"]
            created = obj.get("created")
            self.created = created if isinstance(created, int) else None
            model = obj.get("model")
            self.model = model if isinstance(model, str) else None
        fp = obj.get("system_fingerprint")
        if fp is not None:
            self.fingerprint = fp
        use = obj.get("usage")
        if isinstance(use, dict):
            self._usage(use)
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        c = choices[0]
        if self.chat:
            delta = c.get("delta")
            if isinstance(delta, dict):
                text = delta.get("content")
                key = "reasoning_content" if delta.get("reasoning_content") else "reasoning"
                thought = delta.get(key)
                if isinstance(thought, str) and thought:
                    self.reasoning.append(thought)
                    self.reasoning_key = key  # the engine's name for it (vLLM changed it)
                    self.continuable = False  # the continuation prompt carries content only
                if delta.get("tool_calls"):
                    self.continuable = False
            else:
                text = None
        else:
            text = c.get("text")
        if isinstance(text, str) and text:
            self.parts.append(text)
            self.seg_counted += 1
        finish = c.get("finish_reason")
        if finish is not None:
            self.finish = finish
            skip = ("index", "delta", "text", "logprobs", "finish_reason", "usage")
            self.extra = {k: v for k, v in c.items() if k not in skip}

    def _usage(self, use: dict[str, Any]) -> None:
        self.last_usage = use
        if self.segment == 0 and isinstance(use.get("prompt_tokens"), int):
            self.prompt_tokens = use["prompt_tokens"]
            self.prompt_details = use.get("prompt_tokens_details")
        done = use.get("completion_tokens")
        if isinstance(done, int):
            self.seg_tokens = done

    # ------------------------------------------------------------------ segments

    @property
    def tokens(self) -> int:
        """Completion tokens folded so far, every segment."""
        return self.prior + (self.seg_tokens if self.seg_tokens is not None else self.seg_counted)

    def cut(self) -> Progress:
        """The segment broke: what the answer holds so far, for the continuation."""
        p = Progress(
            text="".join(self.parts),
            tokens=self.tokens,
            done=self.finish is not None,
            stream_id=self.id,
            created=self.created,
        )
        self.prior = p.tokens
        self.seg_tokens = None
        self.seg_counted = 0
        self.segment += 1
        self.events = EventSplitter()  # an event cut in half: its text never reached the fold
        return p

    # ------------------------------------------------------------------ output

    def usage(self) -> dict[str, Any] | None:
        """The answer's usage: the client's prompt, every completion token of every segment."""
        last = self.last_usage
        if last is None:
            return None
        completion = self.tokens
        prompt = self.prompt_tokens
        if prompt is None:
            # The first segment broke before any usage: its prompt is the last one's minus the
            # text it carried (an estimate where re-tokenising the text differs).
            later = last.get("prompt_tokens")
            prompt = max(0, later - self.prior) if isinstance(later, int) else 0
        out = dict(last)
        out["prompt_tokens"] = prompt
        out["total_tokens"] = prompt + completion
        out["completion_tokens"] = completion
        if self.prompt_details is not None or self.segment > 0:
            out["prompt_tokens_details"] = self.prompt_details
        return out

    def answer(self) -> dict[str, Any]:
        """The chat.completion or text_completion for the same request whole: OpenAI's fields,
        and what the stream's chunks carried beyond them (a choice's `stop_reason` …). Fields an
        engine sets only on a whole answer, and only ever null there (vLLM's `metrics`,
        `kv_transfer_params` …), are not invented: no engine version agrees on them."""
        text = "".join(self.parts)
        choice: dict[str, Any]
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning:
                message[self.reasoning_key] = "".join(self.reasoning)
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish}
        choice.update(self.extra)
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }
        if self.fingerprint is not None:
            out["system_fingerprint"] = self.fingerprint
        return out

    def error_answer(self) -> tuple[int, bytes]:
        """(status, body) of the error event the engine ended the stream with."""
        err = self.error or {}
        code = err.get("code")
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        return status, orjson.dumps({"error": err})
