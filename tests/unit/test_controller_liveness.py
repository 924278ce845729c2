"""decide: heartbeat silence -> INACTIVE -> TERMINATED, heartbeats back -> ACTIVE."""

from __future__ import annotations

from core.events import InstanceState
from tests.unit.controller_log import Log, config


def up() -> Log:
    log = Log(config(union=1, nnodes=2))
    log.register("n1")
    log.register("n2")
    log.bring_up()
    return log


def silent(log: Log, node: str, seconds: float) -> None:
    """Time passes; everyone but `node` heartbeats."""
    log.tick(seconds, heartbeats=False)
    for nid in log.state.nodes:
        if nid != node:
            log.heartbeat(nid)


def test_silence_past_the_timeout_makes_the_instance_inactive_and_says_why() -> None:
    log = up()
    silent(log, "n2", 10.0)
    assert log.decide() == []
    silent(log, "n2", 0.5)
    (d,) = log.step()
    assert log.types([d]) == ["instance.state_changed:INACTIVE"]
    reason = d.event.data.reason  # type: ignore[attr-defined]
    assert "heartbeat" in reason and "n2" in reason
    assert d.event.caused_by is not None and d.event.caused_by.seq is None  # heartbeats are not in MOTOR
    assert log.decide() == []


def test_heartbeats_back_make_it_active_again() -> None:
    log = up()
    silent(log, "n2", 11.0)
    log.step()
    log.tick(1.0)
    (d,) = log.step()
    assert log.types([d]) == ["instance.state_changed:ACTIVE"]
    assert "heartbeat" in d.event.data.reason  # type: ignore[attr-defined]


def test_longer_silence_terminates_and_the_silent_node_is_not_reassembled() -> None:
    log = up()
    log.register("spare")
    silent(log, "n2", 11.0)
    log.step()
    silent(log, "n2", 50.0)
    ds = log.step()
    assert log.types(ds) == ["command.stop:n1", "command.stop:n2", "instance.state_changed:TERMINATED"]
    assert all("heartbeat" in d.event.data.reason for d in ds)  # type: ignore[attr-defined]
    log.agents(only=["n1"])  # n2 never applies its stop: it is gone
    (asm,) = log.step()
    assert [m.node_id for m in asm.event.data.members] == ["n1", "spare"]  # type: ignore[attr-defined]


def test_a_silent_node_that_returns_applies_its_stop_and_is_free_again() -> None:
    log = up()
    silent(log, "n2", 61.0)
    log.step()
    log.step()
    assert 1 not in log.state.instances
    log.agents()  # both apply the stop
    log.tick(1.0)
    (asm,) = log.step()
    assert asm.event.data.instance_id == 2  # type: ignore[attr-defined]


def test_isolated_instance_is_not_marked_inactive() -> None:
    log = up()
    log.alarm(1)
    log.step()
    assert log.inst(1) == InstanceState.ISOLATED
    silent(log, "n2", 11.0)
    assert all(
        d.event.data.state != InstanceState.INACTIVE for d in log.decide() if hasattr(d.event.data, "state")
    )  # type: ignore[attr-defined]


def test_after_the_log_was_away_nobody_is_judged_by_the_outage() -> None:
    """NATS away 90 s: no heartbeat reached the controller, although every node kept beating."""
    log = up()
    log.tick(90.0, heartbeats=False)
    log.hearing_since = log.now  # reconnected and caught up just now
    assert log.decide() == []  # 90 s > terminate_after (60 s): judged by the outage it would terminate
    log.tick(9.5, heartbeats=False)
    assert log.decide() == []
    log.tick(0.4)  # the agents' heartbeats come through again
    log.tick(30.0)
    assert log.decide() == []
    assert log.inst(1) == InstanceState.ACTIVE


def test_a_node_still_silent_after_the_grace_is_judged_and_the_reason_says_so() -> None:
    log = up()
    log.tick(40.0, heartbeats=False)
    log.hearing_since = log.now
    silent(log, "n2", 10.0)
    assert log.decide() == []
    silent(log, "n2", 0.5)
    (d,) = log.step()
    assert log.types([d]) == ["instance.state_changed:INACTIVE"]
    reason = d.event.data.reason  # type: ignore[attr-defined]
    assert "heartbeat" in reason and "n2 silent for 50.5s (heard for 10.5s of it)" in reason
    silent(log, "n2", 49.0)
    assert [t for t in log.types(log.decide()) if "TERMINATED" in t] == []  # 59.5 s heard < 60 s
    silent(log, "n2", 1.0)
    assert "instance.state_changed:TERMINATED" in log.types(log.decide())


def test_a_recent_hearing_does_not_bring_a_silent_instance_back() -> None:
    log = up()
    silent(log, "n2", 11.0)
    log.step()
    assert log.inst(1) == InstanceState.INACTIVE
    log.hearing_since = log.now  # e.g. a takeover: n2 is still silent
    log.tick(1.0, heartbeats=False)
    assert log.decide() == []
    assert log.inst(1) == InstanceState.INACTIVE


def test_no_silence_is_counted_past_the_last_moment_heartbeats_could_land() -> None:
    # The heartbeat stream elects a leader (its server died): no heartbeat lands, and a
    # controller that noticed it late still charges the nodes only up to its last answer.
    log = up()
    last_answer = log.now + 1.0
    silent(log, "n1", 0.0)
    log.tick(30.0, heartbeats=False)  # nobody heard for 30 s, the stream answered 1 s in
    log.heard_until = last_answer
    assert log.decide() == []
    log.heard_until = None  # had it answered all along, the silence would be the nodes'
    assert log.types(log.decide()) == ["instance.state_changed:INACTIVE"]
