"""core.fastreplace.replace behaves like dataclasses.replace on our records."""

from __future__ import annotations

import dataclasses

import pytest

from core.fastreplace import replace
from core.reducer import apply
from core.state import ClusterState
from tests.unit.factories import assembled, registered


def _state() -> ClusterState:
    s = ClusterState()
    for seq, ev in enumerate((registered("a"), registered("b", ts=1.5), assembled(1, ["a", "b"])), 1):
        s = apply(s, ev, seq)
    return s


def test_same_result_as_stdlib_for_every_record_kind() -> None:
    s = _state()
    node = s.nodes["a"]
    inst = s.instances[1]
    cases = [
        (s, {"last_seq": 99, "events_applied": 7}),
        (s, {}),
        (node, {"instance_id": None, "last_hb_ts": 5.0}),
        (inst, {"reason": "x"}),
    ]
    for obj, changes in cases:
        got = replace(obj, **changes)
        want = dataclasses.replace(obj, **changes)
        assert got == want
        assert type(got) is type(want)
        assert got is not obj


def test_original_is_untouched() -> None:
    s = _state()
    replace(s, last_seq=1234)
    assert s.last_seq == 3


def test_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="no field 'nope'"):
        replace(ClusterState(), nope=1)


@dataclasses.dataclass(frozen=True)
class _WithPostInit:
    a: int
    b: int = 0

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


def test_classes_with_post_init_use_the_stdlib() -> None:
    with pytest.raises(ValueError, match="a < 0"):
        replace(_WithPostInit(1), a=-1)
    assert replace(_WithPostInit(1), b=2) == _WithPostInit(1, 2)
