"""Fault updates of the builtin engine: partial patches, reset, and field-naming errors."""

from __future__ import annotations

from typing import Any

import pytest

from simengine.injection import FaultError, Faults
from simengine.options import FaultSpec


def test_patch_changes_only_named_fields() -> None:
    f = Faults(FaultSpec(error_rate=0.5))
    spec = f.update({"hang_health": True, "slow_tokens_ms": 3})
    assert (spec.hang_health, spec.slow_tokens_ms, spec.error_rate) == (True, 3.0, 0.5)


def test_reset_clears_everything_before_the_patch() -> None:
    f = Faults(FaultSpec(error_rate=0.5, precision=True))
    spec = f.update({"reset": True, "ft_status": "unhealthy"})
    assert spec == FaultSpec(ft_status="unhealthy")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"hang_health": 1}, "hang_health"),
        ({"error_rate": 2}, "error_rate"),
        ({"error_rate": True}, "error_rate"),
        ({"slow_tokens_ms": -1}, "slow_tokens_ms"),
        ({"crash_after": -1}, "crash_after"),
        ({"die_mid_stream": "3"}, "die_mid_stream"),
        ({"ft_status": "sick"}, "ft_status"),
        ({"explode": True}, "explode"),
    ],
)
def test_bad_patches_name_the_field(patch: dict[str, Any], field: str) -> None:
    f = Faults(FaultSpec())
    with pytest.raises(FaultError, match=field):
        f.update(patch)
    assert f.spec == FaultSpec()


def test_error_rate_extremes() -> None:
    assert not any(Faults(FaultSpec(error_rate=0.0)).roll_error() for _ in range(100))
    assert all(Faults(FaultSpec(error_rate=1.0)).roll_error() for _ in range(100))


def test_error_rate_is_roughly_the_rate() -> None:
    f = Faults(FaultSpec(error_rate=0.3), seed=1)
    hits = sum(f.roll_error() for _ in range(2000))
    assert 450 < hits < 750
