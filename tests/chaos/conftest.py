"""One supervised cluster at a time for the chaos scenarios (`just chaos`).

Scenarios whose faults heal share a cluster (two coordinator replicas on one port); before
each one, `ensure_healthy` checks that the previous scenario left it converged and serving,
and starts a fresh cluster when it did not. A module that needs another shape (one
coordinator, so metrics and fold positions are read from the only replica) gets it from the
same pool, which stops the running cluster first: two clusters never share the machine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosCluster


class ClusterPool:
    """Holds the one running chaos cluster; hands it out healthy, in the shape asked for."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.current: ChaosCluster | None = None
        self.started = 0

    async def get(
        self, *, coordinators: int = 2, max_age: float | None = None, disk: int | None = None
    ) -> ChaosCluster:
        cc = self.current
        if cc is not None and (cc.coordinators, cc.max_age, cc.disk) != (coordinators, max_age, disk):
            await cc.stop()
            cc = self.current = None
        if cc is None:
            self.started += 1
            cc = ChaosCluster(
                self.base / f"shape-{self.started}", coordinators=coordinators, max_age=max_age, disk=disk
            )
            await cc.start()
            self.current = cc
            return cc
        await cc.ensure_healthy()
        return cc

    async def close(self) -> None:
        if self.current is not None:
            await self.current.stop()
            self.current = None


@pytest.fixture(scope="package")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ClusterPool]:
    p = ClusterPool(tmp_path_factory.mktemp("chaos"))
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def chaos(pool: ClusterPool) -> ChaosCluster:
    """The shared cluster, healed: two coordinator replicas sharing the coordinator port."""
    return await pool.get(coordinators=2)
