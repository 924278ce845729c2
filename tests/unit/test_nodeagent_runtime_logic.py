"""Table tests for the node agent's pure runtime logic: health, load, faults, resync, checks."""

from pathlib import Path
from typing import Any

import pytest

from core.bounds import MAX_COUNT
from core.config import HealthCheckConfig, SnapshotConfig
from core.events import (
    Capacity,
    CommandApplied,
    CommandRefused,
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    Role,
    SnapshotPhase,
    StartCommand,
    StartCommandData,
)
from core.reducer import fold
from core.state import ClusterState
from nodeagent import runstate
from nodeagent.command_handler import answer, check_start
from nodeagent.errors import CommandRefusal, Refusal
from nodeagent.faults import FaultTracker
from nodeagent.ftstatus import ft_status
from nodeagent.health import HealthTracker
from nodeagent.loadmetrics import load_from_text
from nodeagent.resync import Running, missing_reason
from nodeagent.snapshot import Snapshot
from nodeagent.supervisor import describe_exit
from tests.unit.factories import assembled, registered

# --------------------------------------------------------------------------- health


def run(tracker: HealthTracker, probes: list[tuple[bool, float]]) -> list[tuple[str, str] | None]:
    out = []
    for ok, now in probes:
        t = tracker.observe(ok, "connection refused" if not ok else "", now)
        out.append((t.status.value, t.reason) if t else None)
    return out


def test_startup_refusals_keep_starting_until_the_timeout() -> None:
    tr = HealthTracker(HealthCheckConfig(startup_timeout=10, retry_attempts=3), started=0.0)
    got = run(tr, [(False, 1), (False, 9.9), (True, 11)])
    assert got[:2] == [None, None]
    assert got[2] == ("READY", "health check passed")


def test_no_health_within_startup_timeout_is_abnormal() -> None:
    tr = HealthTracker(HealthCheckConfig(startup_timeout=10), started=0.0)
    got = run(tr, [(False, 5), (False, 10)])
    assert got[0] is None
    assert got[1] is not None and got[1][0] == "ABNORMAL" and "startup_timeout 10s" in got[1][1]


def test_after_ready_a_failed_check_is_abnormal_then_recovers() -> None:
    # The retries of seed 002 happen inside one check (timeouts only, `check`); a check that
    # still failed turns a READY endpoint ABNORMAL at once.
    tr = HealthTracker(HealthCheckConfig(retry_attempts=2), started=0.0)
    got = run(tr, [(True, 1), (False, 2), (False, 3), (True, 4)])
    assert got[0] is not None and got[0][0] == "READY"
    assert got[1] is not None and got[1][0] == "ABNORMAL" and "connection refused" in got[1][1]
    assert got[2] is None
    assert got[3] is not None and got[3][0] == "READY"


def test_retry_attempts_counts_the_first_request_so_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="retry_attempts"):
        HealthCheckConfig(retry_attempts=0)


@pytest.mark.parametrize(
    ("code", "text"),
    [(0, "process exited with code 0"), (3, "process exited with code 3"), (-9, "process killed by SIGKILL"),
     (-15, "process killed by SIGTERM"), (None, "exit code unknown")],
)  # fmt: skip
def test_describe_exit(code: int | None, text: str) -> None:
    assert text in describe_exit(code)


# --------------------------------------------------------------------------- load


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prompt_tokens_total{model_name="m"} 1e3
"""
SGLANG_METRICS = """sglang:num_running_reqs{model_name="m"} 7
sglang:num_queue_reqs{model_name="m"} 1
sglang:token_usage{model_name="m"} 0.5
"""


@pytest.mark.parametrize(
    ("text", "running", "waiting", "slots", "blocks"),
    [
        (VLLM_METRICS, 5, 4, 251, 750),
        (SGLANG_METRICS, 7, 1, 249, 500),
        ("", 0, 0, 256, 1000),
        ('vllm:kv_cache_usage_perc{a="}"} NaN\nvllm:kv_cache_usage_perc 1.5\n', 0, 0, 256, 0),
    ],
)
def test_load_from_metrics(text: str, running: int, waiting: int, slots: int, blocks: int) -> None:
    load = load_from_text(text)
    cap = Capacity(total_slots=256, total_blocks=1000)
    assert (load.running, load.waiting, load.avail_slots(cap), load.avail_blocks(cap)) == (
        running, waiting, slots, blocks,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "running", "waiting"),
    [
        ("vllm:num_requests_running -3\nvllm:num_requests_waiting -1e9\n", 0, 0),
        ("vllm:num_requests_running +Inf\nvllm:num_requests_waiting -Inf\n", MAX_COUNT, 0),
        ("sglang:num_running_reqs 1e30\nsglang:num_queue_reqs 2.5\n", MAX_COUNT, 2),
    ],
)
def test_an_engine_misreporting_its_load_is_clamped_to_what_a_heartbeat_may_carry(
    text: str, running: int, waiting: int
) -> None:
    """Issue 24: a negative load made the heartbeat undecodable (poison: the node's load was
    lost), and +Inf raised OverflowError in the heartbeat loop."""
    load = load_from_text(text)
    assert (load.running, load.waiting) == (running, waiting)
    cap = Capacity(total_slots=256, total_blocks=1000)
    EndpointLoad(
        id=0,
        status=EndpointStatus.READY,
        running=load.running,
        waiting=load.waiting,
        avail_slots=load.avail_slots(cap),
        avail_blocks=load.avail_blocks(cap),
    )


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"status": "healthy", "reason": None}, "healthy"),
        ({"status": "Unhealthy"}, "unhealthy"),
        ({"engine_status": "dead"}, "dead"),
        ({"ranks": None, "state": [{"status": "healthy"}, {"status": "dead"}]}, "dead"),
        ([{"status": "healthy"}, {"status": "unhealthy"}], "unhealthy"),
        ({"status": "weird"}, None),
        ("dead", "dead"),
        (42, None),
    ],
)
def test_ft_status(body: Any, status: str | None) -> None:
    assert ft_status(body) == status


def test_fault_tracker_reports_changes_only() -> None:
    tr = FaultTracker(max_poll_failures=2)
    seq = ["healthy", "unhealthy", "unhealthy", "dead", "healthy", None, None, None, "healthy"]
    got = [tr.observe(s) for s in seq]
    assert got == [
        [],
        [("report", "engine_unhealthy")],
        [],
        [("clear", "engine_unhealthy"), ("report", "engine_dead")],
        [("clear", "engine_dead")],
        [],
        [("report", "engine_dead")],
        [],
        [("clear", "engine_dead")],
    ]


# --------------------------------------------------------------------------- resync


def state_with(*events: Any) -> ClusterState:
    return fold((i + 1, ev) for i, ev in enumerate(events))


RUN9 = Running(instance_id=9, endpoints=(0,), start_seq=2)


@pytest.mark.parametrize(
    ("state", "running", "kw", "reason", "instance_only"),
    [
        (state_with(registered("n1")), Running(None, (), 0), {}, None, False),
        (state_with(registered("n2")), Running(None, (), 0), {}, "no registration", False),
        (state_with(registered("n1")), Running(None, (), 0), {"reg_seq": 1, "first_seq": 5}, "no longer in the stream", False),
        (state_with(registered("n1")), Running(None, (), 0), {"reg_seq": 8, "last_seq": 3}, "tail lost", False),
        (ClusterState(), Running(None, (), 0), {"reg_seq": 1}, None, False),  # fold not there yet
        (state_with(registered("n1"), assembled(9, ["n1"])), RUN9, {}, None, False),
        (state_with(registered("n1"), assembled(4, ["n1"])), RUN9, {}, "missing from the log", True),
        (state_with(registered("n1"), assembled(9, ["n2"])), RUN9, {}, "assigns instance None", True),
        # Our latest registration already says what runs here: nothing more to say.
        (state_with(registered("n1", instance_id=9, running_endpoints=(0,))), RUN9, {}, None, False),
        # The start command is beyond the fold: its instance may simply not be folded yet.
        (state_with(registered("n1")), Running(9, (0,), 50), {}, None, False),
    ],
)  # fmt: skip
def test_missing_reason(
    state: ClusterState, running: Running, kw: dict[str, int], reason: str | None, instance_only: bool
) -> None:
    args = {"reg_seq": 1, "first_seq": 1, "last_seq": 100, **kw}
    got, only = missing_reason(state, "n1", running, **args)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got
        assert only is instance_only


# --------------------------------------------------------------------------- start checks


def ep(i: int = 0, port: int = 9000) -> EndpointSpec:
    return EndpointSpec(id=i, ip="10.0.0.5", business_port=port, mgmt_port=port)


def cmd(**kw: Any) -> StartCommandData:
    base: dict[str, Any] = {
        "command_id": "c1", "node_id": "n1", "instance_id": 1, "job_name": "job", "role": Role.UNION,
        "engine_type": "builtin", "model": "m", "endpoints": (ep(),), "master_dp_ip": "10.0.0.1",
    }  # fmt: skip
    base.update(kw)
    return StartCommandData(**base)


@pytest.mark.parametrize(
    ("kw", "code", "needle"),
    [
        ({"job_name": "other"}, "job_mismatch", "'other'"),
        ({"role": Role.PREFILL}, "role_mismatch", "'prefill'"),
        ({"engine_type": "vllm"}, "engine_mismatch", "'vllm'"),
        ({"node_id": "n2"}, "wrong_node", "'n2'"),
        ({"endpoints": ()}, "bad_endpoint", "no endpoints"),
        ({"endpoints": (ep(3),)}, "bad_endpoint", "endpoint 3"),
        ({"endpoints": (ep(0, 9100),)}, "bad_endpoint", "9100"),
        ({"endpoints": (ep(), ep())}, "bad_endpoint", "twice"),
    ],
)
def test_check_start_refusals(kw: dict[str, Any], code: str, needle: str) -> None:
    with pytest.raises(CommandRefusal) as err:
        check_start(cmd(**kw), node_id="n1", job_name="job", role=Role.UNION, engine_type="builtin",
                    registered=(ep(),))  # fmt: skip
    assert err.value.code == code and needle in err.value.reason


def test_check_start_accepts_a_fitting_command() -> None:
    check_start(
        cmd(), node_id="n1", job_name="job", role=Role.UNION, engine_type="builtin", registered=(ep(),)
    )


# --------------------------------------------------------------------------- run state


def test_run_state_round_trip_and_bounded_history(tmp_path: Path) -> None:
    path = tmp_path / "run" / "nodeagent-n1.json"
    st = runstate.RunState(
        node_id="n1", instance_id=3, start=cmd(), start_seq=12,
        endpoints=(runstate.EndpointRun(endpoint_id=0, pid=123, start_time=99, business_port=9000, spec=ep()),),
    )  # fmt: skip
    for i in range(runstate.MAX_DONE + 5):
        st = runstate.remember(st, f"c{i}", "applied")
    st = runstate.remember(st, "c7", Refusal(code="port_in_use", reason="x: taken"))
    runstate.save(path, st)
    back = runstate.load(path, "n1")
    assert back == st
    assert len(back.done) == runstate.MAX_DONE
    assert runstate.outcome_of(back, "c7") == Refusal(code="port_in_use", reason="x: taken")
    assert runstate.outcome_of(back, "c0") is None
    assert runstate.load(path, "n2") == runstate.RunState(node_id="n2")
    path.write_text("{not json")
    assert runstate.load(path, "n1") == runstate.RunState(node_id="n1")


def test_run_state_written_before_outcomes_were_typed_reads_refusals_as_refusals(tmp_path: Path) -> None:
    path = tmp_path / "nodeagent-n1.json"
    path.write_text(
        '{"node_id": "n1", "done": [["c1", "applied"], ["c2", "refused:port_in_use:port 9000: taken"]]}'
    )
    back = runstate.load(path, "n1")
    assert runstate.outcome_of(back, "c1") == "applied"
    assert runstate.outcome_of(back, "c2") == Refusal(code="port_in_use", reason="port 9000: taken")


def test_a_command_is_answered_from_its_outcome() -> None:
    start = StartCommand(id="c1", ts=1.0, source="controller/a", data=cmd())
    applied = answer("n1", "nodeagent/n1", start, "applied")
    assert isinstance(applied, CommandApplied)
    assert (applied.data.verb, applied.data.command_id, applied.data.instance_id) == ("start", "c1", 1)
    refused = answer("n1", "nodeagent/n1", start, Refusal(code="stale_term", reason="term 1 < 2"))
    assert isinstance(refused, CommandRefused)
    assert (refused.data.code, refused.data.reason) == ("stale_term", "term 1 < 2")
    assert refused.id == applied.id  # one answer per command, whichever it is


# --------------------------------------------------------------------------- snapshot


def test_snapshot_phases_from_observation(tmp_path: Path) -> None:
    cfg = SnapshotConfig(
        enabled=True, metadata_dir=str(tmp_path), model_save_path="/save", model_load_path="/load"
    )
    ready = {"now": False}
    phases: list[SnapshotPhase] = []
    snap = Snapshot(cfg, "10.0.0.5", lambda p, m: phases.append(p), lambda: ready["now"])
    meta = snap.prepare(cmd(job_name="job", master_dp_ip="10.0.0.1"))
    assert meta["model_save_path"] == "/save" and meta["data_parallel_master_ip"] == "10.0.0.1"
    assert meta["job_name"] == "job" and meta["model_load_path"] == "/load"
    snap.step()
    assert phases == [SnapshotPhase.METADATA_PREPARED] and not snap.pending
    ready["now"] = True
    snap.step()
    assert phases[-1] == SnapshotPhase.SUSPENDED and snap.pending and snap.steady
    snap.step()
    assert phases[-1] == SnapshotPhase.SUSPENDED
    (tmp_path / "checkpoint").touch()
    snap.step()
    assert phases[-1] == SnapshotPhase.CHECKPOINT_DONE and snap.pending
    snap.step()
    assert phases[-1] == SnapshotPhase.RESTORED and not snap.pending
    # A value already in the file (a restore) wins over the command's master IP.
    again = snap.prepare(cmd(master_dp_ip="10.9.9.9"))
    assert again["data_parallel_master_ip"] == "10.0.0.1"


def test_snapshot_restore_detected_by_a_moved_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SnapshotConfig(enabled=True, metadata_dir=str(tmp_path))
    old = Snapshot(cfg, "10.0.0.5", lambda p, m: None, lambda: True)
    old.prepare(cmd(job_name="job-x"))
    assert old.restored_job() is None  # no checkpoint yet
    (tmp_path / "metadata").mkdir()
    (tmp_path / "checkpoint").touch()
    assert old.restored_job() is None  # same pod: a plain restart
    moved = Snapshot(cfg, "10.0.0.77", lambda p, m: None, lambda: True)
    assert moved.restored_job() == "job-x"
    monkeypatch.setenv("MOTOR_SNAPSHOT_RESTORED", "1")
    assert old.restored_job() == "job-x"
