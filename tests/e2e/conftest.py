"""The e2e suite's cluster: one `motor up`-style cluster per module (tests/localcluster.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.events import InstanceState
from tests.localcluster import Harness, cluster_config, running_cluster


@pytest.fixture(scope="module")
async def harness(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    async with running_cluster(
        tmp_path_factory.mktemp("motor-up"),
        cluster_config(),
        nodes=4,  # one spare: a replaced node has somewhere to go
        ready="three ACTIVE instances (union, prefill, decode)",
        ready_pred=lambda s: sum(1 for i in s.instances.values() if i.state == InstanceState.ACTIVE) >= 3,
    ) as h:
        yield h
