"""One three-host cluster for the multi-host scenarios (`just test-multihost`, root only).

Scenarios whose faults heal share it; before each, `ensure_healthy` checks that the last one
left it converged and serving, else a fresh cluster (and network) is built. The network is
removed after the last scenario, or after a failure: no namespace, veth or bridge is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator

import pytest

from tests.multihost.harness import MultiHost
from tests.multihost.netns import sweep

pytestmark = pytest.mark.multihost


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    why = ""
    if os.geteuid() != 0:
        why = "needs root: hosts are network namespaces (ip netns); run `sudo just test-multihost`"
    elif shutil.which("ip") is None:
        why = "needs iproute2's `ip` (apt-get install iproute2)"
    if why:
        for item in items:
            if "multihost" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="package")
async def hosts_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[MultiHost]:
    mh = MultiHost(tmp_path_factory.mktemp("multihost"))
    await mh.start()
    try:
        yield mh
    finally:
        await mh.stop()
        left = await asyncio.to_thread(sweep)
        assert not left, f"teardown left namespaces or links behind: {left}"


@pytest.fixture
async def mh(hosts_cluster: MultiHost) -> MultiHost:
    await hosts_cluster.ensure_healthy()
    return hosts_cluster
