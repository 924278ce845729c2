"""What this node runs, kept in a small file so a restarted agent can tell the truth.

Written atomically (temp file + rename) whenever engines start or stop. After a restart the
agent re-adopts the engines whose pid still names the same process and re-registers with
them (`instance_id`, `running_endpoints`); the answered commands and the newest leader term
seen are kept too; everything else in the file is discarded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from core.events import EndpointSpec, StartCommandData
from nodeagent.errors import Refusal

log = logging.getLogger(__name__)

# What became of a command: it took effect, or it was refused (and why).
Outcome = Literal["applied"] | Refusal


class EndpointRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    endpoint_id: int
    pid: int
    start_time: int | None  # /proc start time: guards against a recycled pid
    business_port: int
    serves_http: bool = True
    log_file: str = ""
    spec: EndpointSpec | None = None  # as started (global DP rank, bootstrap port, ...)


class RunState(BaseModel):
    model_config = ConfigDict(frozen=True)

    node_id: str
    instance_id: int | None = None
    job_name: str | None = None
    start: StartCommandData | None = None
    start_seq: int = 0  # stream sequence of that start command
    endpoints: tuple[EndpointRun, ...] = ()
    # Command ids already carried out, newest last, with their outcome: a redelivered command
    # is answered the same way and never runs twice.
    done: tuple[tuple[str, Outcome], ...] = ()
    # The newest leader term seen on a command: an older one is refused (`stale_term`), also
    # after a restart of the agent.
    term: int = 0

    @field_validator("done", mode="before")
    @classmethod
    def _upcast_done(cls, done: Any) -> Any:
        """A file written before outcomes were typed says `refused:<code>:<reason>`."""
        if not isinstance(done, list | tuple):
            return done
        return tuple(
            (d[0], _refusal_from_text(d[1])) if isinstance(d, list | tuple) and len(d) == 2 else d
            for d in done
        )


def _refusal_from_text(outcome: Any) -> Any:
    if isinstance(outcome, str) and outcome.startswith("refused:"):
        _, code, reason = [*outcome.split(":", 2), ""][:3]
        return Refusal(code=code, reason=reason)
    return outcome


MAX_DONE = 512


def load(path: Path, node_id: str) -> RunState:
    """The saved run state, or an empty one when absent or unreadable (logged)."""
    try:
        raw: Any = orjson.loads(path.read_bytes())
        state = RunState.model_validate(raw)
    except FileNotFoundError:
        return RunState(node_id=node_id)
    except (OSError, orjson.JSONDecodeError, ValidationError) as exc:
        log.warning("run state %s unreadable (%s); starting empty", path, exc)
        return RunState(node_id=node_id)
    if state.node_id != node_id:
        log.warning("run state %s belongs to node %s, not %s; ignoring it", path, state.node_id, node_id)
        return RunState(node_id=node_id)
    return state


def save(path: Path, state: RunState) -> None:
    """Write the run state atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(state.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)


def remember(state: RunState, command_id: str, outcome: Outcome) -> RunState:
    """The state with one more finished command (bounded history)."""
    done = (*(d for d in state.done if d[0] != command_id), (command_id, outcome))
    return state.model_copy(update={"done": done[-MAX_DONE:]})


def outcome_of(state: RunState, command_id: str) -> Outcome | None:
    """How the command was answered, if this node has answered it."""
    for cid, outcome in state.done:
        if cid == command_id:
            return outcome
    return None
