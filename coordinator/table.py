"""RoutingTable: the coordinator's fold over the log, and the index the hot path reads.

The table keeps a `core.state.ClusterState` (folded with `core.reducer.apply`, the same fold
the controller and the replay tool use) and derives from it the endpoints a request may go
to. Deriving is lazy: `apply` only marks the index dirty, the next read rebuilds it, so
replaying a long log costs one rebuild, not one per event. Heartbeats (many) skip the
reducer: their load numbers go straight onto the live `Endpoint` objects (and a small side
table for rebuilds), so the state's per-node `load`/`last_hb_ts` are not kept here — the
controller's fold owns liveness.

`Endpoint` objects are kept across rebuilds (matched by key) so the proxy's `inflight`
counts survive unrelated events.

The table also knows each endpoint's incarnation (the engine process behind its READY): when
READY arrives for another process, `on_incarnation` tells the breaker, whose circuit belonged
to the old one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from coordinator.derive import Derived, copy_attrs, derive
from coordinator.endpoint import Endpoint, Incarnation, Plan
from coordinator.losshold import LossHold
from coordinator.plan import GENERATION, Serves, make_plan
from core.events import (
    AnyEvent,
    CircuitChanged,
    EndpointLoad,
    EndpointStatus,
    EndpointStatusChanged,
    EventBase,
    Heartbeat,
    Role,
    StreamsDisrupted,
)
from core.reducer import apply as reduce_apply
from core.state import ClusterState

__all__ = ["Endpoint", "Incarnation", "Plan", "RoutingTable"]

log = logging.getLogger(__name__)

_ROUTING_FACTS = frozenset({CircuitChanged, StreamsDisrupted})
# (role, model, engine type, capability, engine types): one candidates() list each.
_CandKey = tuple[Role, str | None, str | None, str | None, frozenset[str] | None]


def _never_open(key: str) -> bool:
    return False


class RoutingTable:
    """A fold of lifecycle events into the set of endpoints requests may be routed to."""

    def __init__(self, state: ClusterState | None = None) -> None:
        self._state = state if state is not None else ClusterState()
        self.is_open: Callable[[str], bool] = _never_open  # the proxy's circuit breaker
        # Optional fast path: True when no circuit can be open, so candidates() skips the filter.
        self.breaker_idle: Callable[[], bool] | None = None
        self._loads: dict[tuple[str, int], EndpointLoad] = {}
        self._version = 0
        self._dirty = True
        self._all: dict[str, Derived] = {}
        self._routable: tuple[Endpoint, ...] = ()
        self._by_node_ep: dict[tuple[str, int], Endpoint] = {}
        self._known_models: frozenset[str] = frozenset()
        self._cand_cache: dict[_CandKey, list[Endpoint]] = {}
        self._plan_cache: dict[str | None, Plan] = {}  # the /v1 generation routes' plans
        self._route_plans: dict[tuple[Serves, str | None], Plan] = {}  # every other route's
        self._signature: tuple[Any, ...] = ()
        self.last_seq = 0  # MOTOR stream sequence of the last event applied
        self._incarnations: dict[str, Incarnation] = {}
        self._hold = LossHold()  # what stays routable across a lost log (coordinator.losshold)
        # Called with (key, incarnation) when an endpoint reports READY as another process.
        self.on_incarnation: Callable[[str, Incarnation], None] | None = None
        # Called with (key, why) when a routable endpoint stops being so (the proxy ends the
        # exchanges waiting on it); `schedule` runs a callable soon (the loop's call_soon), so
        # a live fold notices at once instead of at the next request's read.
        self.on_leave: Callable[[str, str], None] | None = None
        self.schedule: Callable[[Callable[[], None]], object] | None = None
        self._check_due = False

    # ------------------------------------------------------------------ fold

    @property
    def state(self) -> ClusterState:
        """The folded cluster state (read-only)."""
        return self._state

    def apply(self, event: AnyEvent | EventBase, seq: int = 0) -> None:
        """Fold one event; `seq` is its MOTOR stream sequence (heartbeats have their own stream)."""
        if isinstance(event, Heartbeat):
            # MOTOR_HB sequences are another stream's (and heartbeats change no routability):
            # folding them through the reducer would cost ~10x more for nothing we read.
            self._apply_load(event)
            return
        etype = type(event)
        if etype in _ROUTING_FACTS:
            # This or another coordinator's circuit and stream outcomes: history, not state;
            # folding them would only make every replica rebuild its index once a second.
            if seq > self.last_seq:
                self.last_seq = seq
            return
        if isinstance(event, EndpointStatusChanged) and event.data.status == EndpointStatus.READY:
            self._ready(event, seq)
        self._state = reduce_apply(self._state, event, seq)
        if seq > self.last_seq:
            self.last_seq = seq
        self._dirty = True
        if self.schedule is not None and not self._check_due:
            self._check_due = True  # once per burst of events: one rebuild, as a read would
            self.schedule(self._check)

    def _check(self) -> None:
        self._check_due = False
        if self._dirty:
            self._rebuild()  # tells `on_leave` of what stopped being routable

    def _ready(self, ev: EndpointStatusChanged, seq: int) -> None:
        """Note which process a READY is about; a new one resets the endpoint's circuit."""
        d = ev.data
        key = f"{d.node_id}/{d.endpoint_id}"
        known = self._incarnations.get(key)
        if known is not None:
            if d.pid is not None and known.pid is not None:
                if d.pid == known.pid:
                    return  # the same process said READY again (an agent restart, a re-assertion)
            elif d.previous == EndpointStatus.READY:
                return  # no pid to compare: only a READY after something else is a new process
        inc = Incarnation(d.pid, seq)
        self._incarnations[key] = inc
        if known is not None and self.on_incarnation is not None:
            log.info("endpoint %s is a new process (%s, seq %d)", key, inc.describe(), seq)
            self.on_incarnation(key, inc)

    def hold_across_loss(self) -> int:
        """The log was lost: what is routable now stays so while the new log re-adopts it (how
        many endpoints that is)."""
        if self._dirty:
            self._rebuild()
        self._hold = LossHold({k: self._incarnations.get(k) for k, d in self._all.items() if d.routable})
        self._dirty = True
        return len(self._hold.held)

    def release_hold(self) -> None:
        """From now on the new log alone decides (the re-adoption had its time)."""
        if self._hold.held:
            self._hold = LossHold()
            self._dirty = True

    def incarnation(self, key: str) -> Incarnation | None:
        """The engine process behind the endpoint's last READY, if it ever was READY."""
        return self._incarnations.get(key)

    def _apply_load(self, hb: Heartbeat) -> None:
        node_id = hb.data.node_id
        loads = self._loads
        by_node_ep = self._by_node_ep
        for load in hb.data.endpoints:
            k = (node_id, load.id)
            loads[k] = load
            ep = by_node_ep.get(k)
            if ep is not None:
                ep.running = load.running
                ep.waiting = load.waiting
                ep.avail_slots = load.avail_slots
                ep.avail_blocks = load.avail_blocks

    # ------------------------------------------------------------------ reads

    @property
    def version(self) -> int:
        """Bumps whenever the set of routable endpoints (or their routing attributes) changes."""
        if self._dirty:
            self._rebuild()
        return self._version

    def candidates(
        self,
        role: Role,
        model: str | None,
        *,
        engine_type: str | None = None,
        capability: str | None = None,
        engines: frozenset[str] | None = None,
    ) -> list[Endpoint]:
        """Routable endpoints of `role` serving `model` (any model when None), of `engine_type`
        (or one of `engines`) speaking `capability` when given, breaker-filtered."""
        if self._dirty:
            self._rebuild()
        key = (role, model, engine_type, capability, engines)
        cached = self._cand_cache.get(key)
        if cached is None:
            cached = [
                e
                for e in self._routable
                if e.role == role
                and e.serves(model)
                and (engine_type is None or e.engine_type == engine_type)
                and (engines is None or e.engine_type in engines)
                and (capability is None or capability in e.capabilities)
            ]
            if model is None or model in self._known_models:
                self._cand_cache[key] = cached  # client-chosen unknown names must not grow the cache
        is_open = self.is_open
        if is_open is _never_open:
            return cached
        idle = self.breaker_idle
        if idle is not None and idle():
            return cached
        return [e for e in cached if not is_open(e.key)]

    def plan(self, model: str | None, serves: Serves = GENERATION) -> Plan:
        """What can serve `model` on a route (`serves`; the /v1 generation routes by default):
        P/D when P and D share a capability, else a single hop, else none."""
        if self._dirty:
            self._rebuild()
        if serves is GENERATION:
            cached = self._plan_cache.get(model)
            if cached is None:
                cached = self._make_plan(model, serves)
                if model is None or model in self._known_models:
                    self._plan_cache[model] = cached
            return cached
        key = (serves, model)
        cached = self._route_plans.get(key)
        if cached is None:
            cached = self._make_plan(model, serves)
            if model is None or model in self._known_models:
                self._route_plans[key] = cached
        return cached

    def models(self) -> list[str]:
        """Every model some known instance serves (routable now or not), sorted."""
        if self._dirty:
            self._rebuild()
        return sorted(self._known_models)

    def has_model(self, model: str) -> bool:
        """Whether any known instance serves `model` (unknown model → 404, known but down → 503)."""
        if self._dirty:
            self._rebuild()
        return model in self._known_models

    def routable(self) -> tuple[Endpoint, ...]:
        """Every routable endpoint (before the breaker)."""
        if self._dirty:
            self._rebuild()
        return self._routable

    def endpoint(self, key: str) -> Endpoint | None:
        """The endpoint with this key, routable or not."""
        if self._dirty:
            self._rebuild()
        d = self._all.get(key)
        return d.ep if d is not None else None

    def describe(self) -> list[dict[str, Any]]:
        """Every known endpoint with its routability, for `GET /v1/instances`."""
        if self._dirty:
            self._rebuild()
        out = []
        for key in sorted(self._all):
            d = self._all[key]
            row = d.ep.as_dict()
            row["routable"] = d.routable and not self.is_open(key)
            row["reason"] = d.why if not d.routable else ("circuit open" if self.is_open(key) else "")
            out.append(row)
        return out

    # ------------------------------------------------------------------ plan

    def _make_plan(self, model: str | None, serves: Serves) -> Plan:
        eps = [e for e in self._routable if e.serves(model)]
        return make_plan(eps, model, lambda: self._why_none(model), serves)

    def _why_none(self, model: str | None) -> str:
        what = f"model {model!r}" if model is not None else "any model"
        known = [d for d in self._all.values() if d.ep.serves(model)]
        if not known:
            return f"no instance serves {what}"
        reasons = sorted({d.why for d in known if d.why})
        return f"no routable instance for {what}" + (f" ({'; '.join(reasons)})" if reasons else "")

    # ------------------------------------------------------------------ derive

    def _left(self, was: tuple[Endpoint, ...], derived: dict[str, Derived]) -> None:
        on_leave = self.on_leave
        assert on_leave is not None
        for ep in was:
            d = derived.get(ep.key)
            if d is None:
                on_leave(ep.key, "gone from the log")
            elif not d.routable and d.failed:
                # Failed, not between states: an instance re-assembled or re-adopted after a
                # lost log is briefly INITIAL while its engine serves on; that ends nothing.
                on_leave(ep.key, d.why)

    def _rebuild(self) -> None:
        nodes = self._state.nodes
        if any(n not in nodes for n, _ in self._loads):
            self._loads = {k: v for k, v in self._loads.items() if k[0] in nodes}
        derived = derive(self._state, self._loads, self._incarnations, self._hold)
        old = self._all
        for key, d in derived.items():
            prev = old.get(key)
            if prev is not None:
                # Keep the live object (the proxy holds it and counts in-flight on it).
                copy_attrs(prev.ep, d.ep)
                d.ep = prev.ep
        self._all = derived
        was = self._routable
        self._routable = tuple(d.ep for k, d in sorted(derived.items()) if d.routable)
        if self.on_leave is not None and was:
            self._left(was, derived)
        self._by_node_ep = {}
        for key, d in derived.items():
            if not key.startswith("ext/"):
                node_id, _, ep_id = key.rpartition("/")
                self._by_node_ep[(node_id, int(ep_id))] = d.ep
        self._known_models = frozenset(m for d in derived.values() for m in (d.ep.model, *d.ep.adapters))
        signature = tuple(
            (
                e.key,
                e.role,
                e.engine_type,
                e.model,
                e.host,
                e.port,
                e.bootstrap_port,
                e.capabilities,
                e.group,
                e.adapters,
            )
            for e in self._routable
        )
        if signature != self._signature:
            self._signature = signature
            self._version += 1
        # The plan also depends on the reasons for non-routability; cheap to recompute.
        self._cand_cache = {}
        self._plan_cache = {}
        self._route_plans = {}
        self._dirty = False
