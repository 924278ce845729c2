"""The reducer's table: event class -> the handler that applies it, filled by `handles`.

A handler is `fn(state, event, seq) -> Changes`: the fields of the state the event changes
(None: nothing), never a new state; `core.reducer.apply` makes the one copy per event. The
handlers live by concern beside this module (`nodes`, `commands`, `instances`, `faults`);
each imports `handles` from here, and nothing here imports them back: `core.reducer` imports
them all and checks that every event class has its handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from core.events import EventBase
from core.state import ClusterState

Changes = dict[str, Any] | None
Handler = Callable[[ClusterState, Any, int], Changes]
H = TypeVar("H", bound=Handler)

# event class -> its handler; filled by `handles`, checked complete by `core.reducer`.
HANDLERS: dict[type[EventBase], Handler] = {}


def handles(*classes: type[EventBase]) -> Callable[[H], H]:
    """Declare `fn` the handler of events of `classes` (one handler a class)."""

    def deco(fn: H) -> H:
        for cls in classes:
            if cls in HANDLERS:
                raise TypeError(f"{cls.__name__} has two handlers: {HANDLERS[cls].__name__}, {fn.__name__}")
            HANDLERS[cls] = fn
        return fn

    return deco
