"""Which candidate serves one attempt of a request: every healthy instance of the model competes.

A model's candidates on a route are its union endpoints and its prefill → decode pairs (P and
D speaking one P/D protocol), as the route's plan says (`plan.py`). Each role's configured
policy picks its best endpoint; then the union pick and the P/D pick compete on load and the
lighter one wins (equal loads take turns, so an idle fleet shares a burst). The load of a P/D
candidate is its decode's load: the decode holds a request for its whole generation, as a
union endpoint does, while the prefill holds it only until the first token; the attempt loop
counts a P/D request on its decode from the moment it is chosen, prefill leg included, so a
burst sees the pair as busy at once.

Every fallback follows from the same choice: an endpoint with an open circuit is no
candidate (the table's breaker filter) and one the attempt's filter excludes (it failed this
request) is none either, so a candidate missing a leg drops out — P/D → union → prefill
alone. On a route a pair can split, a prefill serves alone only when no decode of the model
is usable: prefill and decode up but speaking no common protocol fail closed, as the plan
does.

Pure: no I/O, no clock; the policies' own state (rotation, prefix memory) is all it changes.
"""

from __future__ import annotations

from collections.abc import Collection

from coordinator.endpoint import Candidate, Endpoint, Plan
from coordinator.policies import Policy, RequestInfo
from coordinator.table import RoutingTable
from core.events import Role


class Chooser:
    """Chooses a `Candidate` per attempt from the routing table and the per-role policies."""

    def __init__(self, table: RoutingTable, policies: dict[Role, Policy]) -> None:
        self.table = table
        self.union = policies[Role.UNION]
        self.prefill = policies[Role.PREFILL]
        self.decode = policies[Role.DECODE]
        self._turn = False  # whose turn on equal loads: P/D or union

    def choose(self, plan: Plan, info: RequestInfo, exclude: Collection[str] = ()) -> Candidate | None:
        """The candidate for the next attempt on `plan` (the table's, for `info.model` on the
        request's route), or None when no healthy one is left."""
        if plan.kind == "none":
            return None
        table = self.table
        model = info.model
        u: Endpoint | None = None
        if plan.union:
            u = self.union.select(table.candidates(Role.UNION, model, engines=plan.engines), info, exclude)
        for engine_type, capability in plan.pd:
            d = self.decode.select(
                table.candidates(Role.DECODE, model, engine_type=engine_type, capability=capability),
                info,
                exclude,
            )
            if d is None:
                continue
            if u is not None and not self._pd_wins(u, d):
                return Candidate(u)
            p = self.prefill.select(
                table.candidates(Role.PREFILL, model, engine_type=engine_type, capability=capability),
                info,
                exclude,
            )
            if p is not None:
                return Candidate(d, p, capability)
        if u is not None:
            return Candidate(u)
        if plan.prefill:
            alone = self._prefill_alone(plan, info, exclude)
            if alone is not None:
                return alone
        if plan.decode:
            d = self.decode.select(table.candidates(Role.DECODE, model, engines=plan.engines), info, exclude)
            if d is not None:
                return Candidate(d)
        return None

    def _pd_wins(self, u: Endpoint, d: Endpoint) -> bool:
        ul = u.running + u.waiting + u.inflight
        dl = d.running + d.waiting + d.inflight
        if dl != ul:
            return dl < ul
        self._turn = not self._turn
        return self._turn

    def _prefill_alone(self, plan: Plan, info: RequestInfo, exclude: Collection[str]) -> Candidate | None:
        """A prefill as a single hop; where it stands in for a pair, only when no decode of the
        model is usable at all."""
        table, model = self.table, info.model
        if plan.prefill_last:
            for e in table.candidates(Role.DECODE, model, engines=plan.engines):
                if e.key not in exclude:
                    return None  # decodes are up: the pairs failed, and a lone prefill is no stand-in
        p = self.prefill.select(table.candidates(Role.PREFILL, model, engines=plan.engines), info, exclude)
        return Candidate(p) if p is not None else None


def any_path(table: RoutingTable, model: str | None) -> Candidate | None:
    """Some candidate of the model on the /v1 routes that passes the breaker now, policies
    untouched (for readiness)."""
    plan = table.plan(model)
    if plan.kind == "none":
        return None
    if plan.union:
        for e in table.candidates(Role.UNION, model):
            return Candidate(e)
    for engine_type, capability in plan.pd:
        ds = table.candidates(Role.DECODE, model, engine_type=engine_type, capability=capability)
        ps = table.candidates(Role.PREFILL, model, engine_type=engine_type, capability=capability)
        if ds and ps:
            return Candidate(ds[0], ps[0], capability)
    if plan.prefill and not table.candidates(Role.DECODE, model):
        for e in table.candidates(Role.PREFILL, model):
            return Candidate(e)
    return None


def describe_plan(plan: Plan) -> dict[str, object]:
    """A plan as `GET /v1/instances` shows it."""
    return {
        "kind": plan.kind,
        "role": plan.role.value if plan.role else None,
        "capability": plan.capability,
        "engine_type": plan.engine_type,
        "reason": plan.reason,
        "paths": plan.paths,
    }
