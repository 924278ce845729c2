"""The controller's Prometheus objects, in a registry of its own (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    """Every metric the controller exports on `/metrics`."""

    def __init__(self, controller_id: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.is_leader = Gauge(
            "motor_controller_is_leader", "1 while this controller holds the lease", registry=r
        )
        self.leader_changes = Counter(
            "motor_controller_leader_changes_total", "Times this controller became leader", registry=r
        )
        self.events = Counter(
            "motor_controller_events_folded_total", "Events folded into the state", ["stream"], registry=r
        )
        self.skipped = Counter(
            "motor_controller_events_skipped",
            "Events skipped by the fold: undecodable, unknown_type, newer_schema, wrong_subject, inapplicable",
            ["reason"],
            registry=r,
        )
        self.log_lost = Counter(
            "motor_controller_log_lost_total",
            "Times the log was found purged, recreated or rewound and the state rebuilt from it",
            registry=r,
        )
        self.following = Gauge(
            "motor_controller_log_following",
            "1 while NATS is connected and the fold's consumers deliver",
            registry=r,
        )
        self.last_seq = Gauge(
            "motor_controller_state_seq", "MOTOR sequence the state is folded to", registry=r
        )
        self.lag = Gauge(
            "motor_controller_fold_lag_seconds",
            "Age of the newest folded event when it was folded",
            registry=r,
        )
        self.hb_lag = Histogram(
            "motor_controller_heartbeat_lag_seconds",
            "Heartbeat age when folded (the stream's timestamp to our clock; never the node's clock)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.decisions = Counter(
            "motor_controller_decisions_total", "Decisions appended to the log", ["type"], registry=r
        )
        self.conflicts = Counter(
            "motor_controller_append_conflicts_total",
            "Appends refused by expected-last-subject-sequence (someone else wrote first)",
            registry=r,
        )
        self.fenced = Counter(
            "motor_controller_appends_fenced_total",
            "Decisions refused because another controller announced itself (this one was deposed)",
            registry=r,
        )
        self.append_errors = Counter(
            "motor_controller_append_errors_total", "Appends that failed (timeout, refused)", registry=r
        )
        self.decide_seconds = Histogram(
            "motor_controller_decide_seconds",
            "Time one decide call takes",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.checkpoints = Counter("motor_controller_checkpoints_total", "Checkpoints saved", registry=r)
        self.instances = Gauge(
            "motor_controller_instances", "Instances by role and state", ["role", "state"], registry=r
        )
        self.nodes = Gauge("motor_controller_nodes", "Registered nodes", registry=r)
        self.open_faults = Gauge(
            "motor_controller_open_faults", "Open faults by level", ["level"], registry=r
        )
        self.open_alarms = Gauge(
            "motor_controller_open_precision_alarms", "Open precision alarms", registry=r
        )
        info = Gauge("motor_controller_info", "Controller identity", ["id"], registry=r)
        info.labels(controller_id).set(1)
