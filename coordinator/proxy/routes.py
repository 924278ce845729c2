"""Every client route the proxy sends on to engines, as data: one row each, one pipeline for all.

The `/v1` generation routes (chat, completions, embeddings, Anthropic messages) and what
SGLang and vLLM clients call beyond them (seed 003: `/generate`, `/v1/score`, `/v1/rerank`,
`/tokenize`, `/detokenize`) differ only in what a row says: the engine path, which engines
serve it (`plan.Serves`: a native route only the engine types that serve it, `/generate` over
a pair too where an adapter splits it), the client's dialect, the output budgets checked
against the model's limit, and whether a whole answer may be folded or a broken stream
continued. `pipeline.py` serves every row the same way.

Vocabulary: a *route* is what the client called (and the `route` label of the metrics); a
*plan* is what can serve a model on it; a *candidate* is one way to serve one attempt (a
union endpoint, a P/D pair, a lone endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.adapters import splitting
from coordinator.plan import GENERATION, Serves
from core.events import Role

CHAT = b"/v1/chat/completions"
COMPLETIONS = b"/v1/completions"
EMBEDDINGS = b"/v1/embeddings"
MESSAGES = b"/v1/messages"


@dataclass(frozen=True, eq=False, slots=True)
class ClientRoute:
    """One route clients call and the proxy sends on to an engine."""

    name: str  # the metrics label `route`
    path: bytes  # the engine path it is sent to
    serves: Serves = GENERATION
    anthropic: bool = False  # an Anthropic client: its body is translated, every answer in its dialect
    budgets: tuple[str, ...] = ()  # output budgets checked against the model's limit
    chat: bool | None = None  # a long whole answer may be folded (True: chat, False: completions)
    continuable: bool = False  # a stream whose engine broke may go on elsewhere
    native: bool = False  # an engine-native route: refused 501 when no engine type behind serves it

    def unserved(self, rows: list[dict[str, Any]], model: str | None, reason: str) -> tuple[int, str, str]:
        """(status, message, code) when no candidate can serve: 501 naming the engine types a
        native route needs when none of them is behind this coordinator, else 503."""
        if not self.native:
            return 503, reason or "no routable instance", "no_routable_instance"
        engines = self.serves.engines or frozenset()
        path = self.path.decode()
        known = sorted({row["engine_type"] for row in rows if model is None or row["model"] == model})
        if any(t in engines for t in known):
            return (
                503,
                f"{path}: no routable {'/'.join(sorted(engines))} engine right now",
                "no_routable_instance",
            )
        behind = ", ".join(known) if known else "none"
        message = (
            f"{path} is not served by the engines behind this coordinator (engine types: {behind}); "
            f"it needs {' or '.join(sorted(engines))}"
        )
        return 501, message, "route_not_supported"


def _native(name: str, path: bytes, engines: tuple[str, ...], alone: tuple[Role, ...]) -> ClientRoute:
    serves = Serves(frozenset(engines), alone, splitting(path))
    return ClientRoute(name, path, serves, native=True)


_ANY = (Role.UNION, Role.PREFILL, Role.DECODE)
ROUTES: dict[bytes, ClientRoute] = {
    CHAT: ClientRoute(
        "chat", CHAT, budgets=("max_tokens", "max_completion_tokens"), chat=True, continuable=True
    ),
    COMPLETIONS: ClientRoute(
        "completions", COMPLETIONS, budgets=("max_tokens",), chat=False, continuable=True
    ),
    EMBEDDINGS: ClientRoute("embeddings", EMBEDDINGS),
    MESSAGES: ClientRoute(
        "messages", CHAT, anthropic=True, budgets=("max_tokens",), chat=True, continuable=True
    ),
    b"/generate": _native("generate", b"/generate", ("sglang", "builtin"), (Role.UNION,)),
    b"/v1/score": _native("score", b"/v1/score", ("sglang", "vllm", "builtin"), (Role.UNION, Role.PREFILL)),
    b"/v1/rerank": _native(
        "rerank", b"/v1/rerank", ("sglang", "vllm", "builtin"), (Role.UNION, Role.PREFILL)
    ),
    b"/tokenize": _native("tokenize", b"/tokenize", ("vllm", "builtin"), _ANY),
    b"/detokenize": _native("detokenize", b"/detokenize", ("vllm", "builtin"), _ANY),
}
