"""Which engines a seed-003 route may go to: its row of the route table and the plan it gives."""

from __future__ import annotations

import pytest

from coordinator.endpoint import Endpoint
from coordinator.plan import make_plan
from coordinator.proxy.routes import ROUTES
from core.events import Role


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
