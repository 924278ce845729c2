"""Reducer handlers for faults and alarms: node faults, precision alarms, and the
coordinator's routing facts (history for `motor replay`, not lifecycle state)."""

from __future__ import annotations

from core.events import (
    CircuitChanged,
    EventBase,
    FaultCleared,
    FaultReported,
    PrecisionAlarmCleared,
    PrecisionAlarmRaised,
    StreamsDisrupted,
)
from core.handlers import Changes, handles
from core.state import AlarmRecord, ClusterState, FaultRecord


@handles(FaultReported)
def _fault_reported(s: ClusterState, ev: FaultReported, seq: int) -> Changes:
    rec = FaultRecord(ev.data, ev.ts, seq, ev.id)
    return dict(faults=s.faults.set(ev.data.fault_id, rec))


@handles(FaultCleared)
def _fault_cleared(s: ClusterState, ev: FaultCleared, seq: int) -> Changes:
    if ev.data.fault_id not in s.faults:
        return None
    return dict(faults=s.faults.delete(ev.data.fault_id))


@handles(PrecisionAlarmRaised)
def _alarm_raised(s: ClusterState, ev: PrecisionAlarmRaised, seq: int) -> Changes:
    rec = AlarmRecord(ev.data, ev.ts, seq, ev.id)
    return dict(alarms=s.alarms.set(ev.data.d_instance_id, rec))


@handles(PrecisionAlarmCleared)
def _alarm_cleared(s: ClusterState, ev: PrecisionAlarmCleared, seq: int) -> Changes:
    if ev.data.d_instance_id not in s.alarms:
        return None
    return dict(alarms=s.alarms.delete(ev.data.d_instance_id))


@handles(CircuitChanged, StreamsDisrupted)
def _routing_fact(s: ClusterState, ev: EventBase, seq: int) -> Changes:
    """A coordinator's circuit or stream outcome: history for `motor replay`, not lifecycle state."""
    return None
