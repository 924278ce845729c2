"""Which engines a seed-003 route may go to: its row of the route table and the plan it gives."""

from __future__ import annotations

import pytest

from coordinator.choose import Chooser
from coordinator.endpoint import Endpoint
from coordinator.plan import make_plan
from coordinator.policies import RequestInfo, make_policy
from coordinator.proxy.routes import ROUTES
from coordinator.table import RoutingTable
from core.events import Role
from tests.unit.coord_events import instance_events


def ep(role: Role, engine_type: str, *, caps: tuple[str, ...] = (), model: str = "m", n: int = 0) -> Endpoint:
    return Endpoint(
        key=f"{role.value}/{engine_type}/{n}", instance_id=n, role=role, engine_type=engine_type, model=model,
        host="127.0.0.1", port=9000 + n, bootstrap_port=None, capabilities=frozenset(caps), group=None,
    )  # fmt: skip


U, P, D = Role.UNION, Role.PREFILL, Role.DECODE


@pytest.mark.parametrize(
    ("path", "eps", "want"),
    [
        (b"/generate", [ep(U, "sglang")], ("single", U)),
        (b"/generate", [ep(U, "builtin")], ("single", U)),
        (
            b"/generate",
            [ep(P, "sglang", caps=("bootstrap",)), ep(D, "sglang", caps=("bootstrap",))],
            ("pd", None),
        ),
        (
            b"/generate",
            [ep(P, "sglang", caps=("bootstrap",))],
            ("none", None),
        ),  # a prefill alone cannot answer
        (
            b"/generate",
            [ep(U, "vllm"), ep(P, "vllm", caps=("handoff",)), ep(D, "vllm", caps=("handoff",))],
            ("none", None),
        ),
        (b"/tokenize", [ep(U, "sglang")], ("none", None)),
        (b"/tokenize", [ep(D, "vllm", caps=("handoff",))], ("single", D)),
        (b"/detokenize", [ep(P, "vllm"), ep(U, "vllm")], ("single", U)),
        (b"/v1/score", [ep(P, "vllm")], ("single", P)),
        (b"/v1/rerank", [ep(D, "vllm")], ("none", None)),
        (b"/v1/rerank", [ep(U, "sglang", model="other")], ("none", None)),
    ],
)
def test_route_plan(path: bytes, eps: list[Endpoint], want: tuple[str, Role | None]) -> None:
    mine = [e for e in eps if e.model == "m"]  # the table hands the plan one model's endpoints
    plan = make_plan(mine, "m", lambda: "nothing", ROUTES[path].serves)
    assert (plan.kind, plan.role) == want
    if plan.kind == "pd":
        assert plan.capability == "bootstrap" and plan.engine_type == "sglang"


def test_native_paths_are_rows_of_the_one_route_table() -> None:
    for path in (b"/generate", b"/v1/score", b"/v1/rerank", b"/tokenize", b"/detokenize"):
        route = ROUTES[path]
        assert route.native and route.path == path and not route.continuable and route.chat is None
    for path in (b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/messages"):
        assert not ROUTES[path].native
    for path in (b"/v1/models", b"/v1/models/m", b"/metrics"):
        assert path not in ROUTES  # answered by the proxy itself or the management app


def test_a_native_route_falls_back_across_its_lone_roles_and_never_to_an_engine_that_lacks_it() -> None:
    """The chooser serves native routes as it serves /v1: the preferred lone role first, the
    next one when it fails this request; an engine type that does not serve the route never."""
    t = RoutingTable()
    seq = 0
    for iid, role, engine_type, caps in (
        (1, U, "vllm", ()),
        (2, D, "vllm", ("handoff",)),
        (3, U, "sglang", ()),  # sglang serves no /tokenize
    ):
        for ev in instance_events(iid, role, engine_type=engine_type, capabilities=caps):
            seq += 1
            t.apply(ev, seq)
    chooser = Chooser(t, {r: make_policy("round_robin") for r in Role})
    serves = ROUTES[b"/tokenize"].serves
    info = RequestInfo("motor-sim", None, "r")

    def pick(exclude: set[str]) -> str | None:
        cand = chooser.choose(t.plan("motor-sim", serves), info, exclude)
        return None if cand is None else cand.ep.key

    assert {pick(set()) for _ in range(4)} == {"n1/0"}  # the union, and only the one that serves it
    assert pick({"n1/0"}) == "n2/0"  # the union failed this request: a decode answers alone
    assert pick({"n1/0", "n2/0"}) is None
    plan = t.plan("motor-sim", serves)
    assert (plan.kind, plan.role, plan.union, plan.decode, plan.pd) == ("single", U, True, True, ())
    assert t.plan("motor-sim", serves) is plan  # one plan a route, cached until the table moves
