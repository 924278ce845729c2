"""Container snapshot flow on a whole cluster (builtin engine, vLLM's snapshot protocol).

The node agent prepares metadata and observes; it never calls the engine's suspend/resume.
While a checkpoint is pending the instance is out of service; once the host checkpoint is
done and the engine is healthy it comes back; a container restored elsewhere re-registers
with its new pod IP and keeps its instance id.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import orjson
import pytest

from core.events import InstanceState, Role, SnapshotPhase
from tests.localcluster import (
    Harness,
    cluster_config,
    engine_pid,
    kill_child,
    restart_child,
    running_cluster,
)


@pytest.fixture(scope="module")
async def snap(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Harness, Path]]:
    root = tmp_path_factory.mktemp("motor-snapshot")
    meta = root / "snapshot"
    cfg = cluster_config(
        union={"instances": 1, "snapshot": {"enabled": True, "metadata_dir": str(meta)}},
        prefill=None,
        decode=None,
    )
    async with running_cluster(
        root,
        cfg,
        nodes=1,
        ready="the union node suspended for its snapshot",
        ready_pred=lambda s: any(r.phase == SnapshotPhase.SUSPENDED for r in s.snapshots.values()),
    ) as h:
        yield h, meta


async def ask(h: Harness) -> str:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="none", max_retries=0, timeout=30)
    try:
        r = await client.completions.create(
            model="motor-sim", prompt="snapshot me", max_tokens=8, temperature=0
        )
        return r.choices[0].text
    finally:
        await client.close()


async def test_pending_checkpoint_keeps_the_instance_out_of_service(snap: tuple[Harness, Path]) -> None:
    h, meta = snap
    iid = h.instance_of(Role.UNION)
    await h.wait_for(
        "instance out of service while the checkpoint is pending",
        lambda s: (
            s.instances[iid].state in (InstanceState.INITIAL, InstanceState.INACTIVE)
            and s.snapshot_pending(iid)
        ),
        within=30,
    )
    metadata = orjson.loads((meta / "snapshot_metadata.json").read_bytes())
    assert metadata["job_name"] and metadata["data_parallel_master_ip"] == "127.0.0.1"
    with pytest.raises(openai.APIStatusError) as err:
        await ask(h)
    assert err.value.status_code == 503


async def test_checkpoint_done_then_engine_healthy_restores_service(snap: tuple[Harness, Path]) -> None:
    h, meta = snap
    iid = h.instance_of(Role.UNION)
    (meta / "checkpoint").write_text("done")  # the host side finished its checkpoint
    await h.wait_for(
        "phase checkpoint_done in the log",
        lambda s: h.seen("snapshot.checkpoint", phase=SnapshotPhase.CHECKPOINT_DONE),
    )
    await h.wait_for(
        "restored and ACTIVE", lambda s: not s.snapshot_pending(iid) and h.active(iid), within=60
    )
    assert await ask(h)


async def test_restored_container_reregisters_with_new_ip_and_keeps_instance_id(
    snap: tuple[Harness, Path],
) -> None:
    h, _meta = snap
    iid = h.instance_of(Role.UNION)
    node = h.state.instances[iid].spec.members[0].node_id
    # The container goes away (agent and engine) and comes back elsewhere from its snapshot.
    engine = engine_pid(h.engine_port(iid))
    kill_child(h.cluster, f"nodeagent-{node}")
    os.killpg(os.getpgid(engine), signal.SIGKILL)
    restart_child(
        h.cluster, f"nodeagent-{node}", set_args={"--ip": "127.0.0.2"}, env={"MOTOR_SNAPSHOT_RESTORED": "1"}
    )
    await h.wait_for(
        "re-registration marked restored with the new pod IP",
        lambda s: (n := s.nodes.get(node)) is not None and n.reg.restored and n.reg.pod_ip == "127.0.0.2",
        within=60,
    )
    await h.wait_for(
        f"instance {iid} ACTIVE again at 127.0.0.2",
        lambda s: h.active(iid) and s.instances[iid].spec.members[0].ip == "127.0.0.2",
        within=90,
    )
    assert iid in h.state.instances and h.instance_of(Role.UNION) == iid
    assert await ask(h)
