"""Engine backends: each turns an engine section plus a start command into a native launch.

One module per engine type (`vllm`, `sglang`, `builtin`), each exposing the same three pure
functions (`capabilities`, `capacity`, `launch`) over the types of `launch.py`;
`backend_for(engine_type)` picks one.
"""

from __future__ import annotations

from types import ModuleType
from typing import cast

from nodeagent.backends import builtin, sglang, vllm
from nodeagent.backends.launch import Backend
from nodeagent.errors import StartupError


def backend_for(engine_type: str) -> Backend:
    """The backend module of an engine type; a clear error for an unknown one."""
    modules: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "builtin": builtin}
    module = modules.get(engine_type)
    if module is None:
        raise StartupError(f"engine_type {engine_type!r} has no backend (known: {', '.join(modules)})")
    return cast(Backend, module)
