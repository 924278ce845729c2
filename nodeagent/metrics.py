"""Prometheus objects of the node agent, in one registry owned by the running agent."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from core.events import EndpointStatus


class AgentMetrics:
    def __init__(self, node_id: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["node"]
        self.node_id = node_id
        self.endpoint_status = Gauge(
            "motor_nodeagent_endpoint_status",
            "1 for the current status of each endpoint, 0 for the others.",
            [*labels, "endpoint", "status"],
            registry=self.registry,
        )
        self.commands = Counter(
            "motor_nodeagent_commands",
            "Start/stop commands handled, by verb and outcome.",
            [*labels, "verb", "outcome"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "motor_nodeagent_registrations",
            "node.registered events published, by why.",
            [*labels, "why"],
            registry=self.registry,
        )
        self.heartbeats = Counter(
            "motor_nodeagent_heartbeats", "Heartbeats published.", labels, registry=self.registry
        )
        self.heartbeat_failures = Counter(
            "motor_nodeagent_heartbeat_failures",
            "Heartbeats that could not be published.",
            labels,
            registry=self.registry,
        )
        self.engine_exits = Counter(
            "motor_nodeagent_engine_exits",
            "Engine processes that exited unasked.",
            labels,
            registry=self.registry,
        )
        self.faults = Counter(
            "motor_nodeagent_faults_reported",
            "fault.reported events, by code.",
            [*labels, "code"],
            registry=self.registry,
        )
        self.kv_frames_malformed = Counter(
            "motor_nodeagent_kv_frames_malformed",
            "KV event messages from an engine that could not be decoded (skipped).",
            [*labels, "endpoint"],
            registry=self.registry,
        )
        self.kv_gaps = Counter(
            "motor_nodeagent_kv_gaps",
            "Gaps in an engine's KV event sequence, by outcome (recovered from its replay socket, or lost).",
            [*labels, "endpoint", "outcome"],
            registry=self.registry,
        )
        self.kv_view_publishes = Counter(
            "motor_nodeagent_kv_view_publishes",
            "Compacted KV views written to the motor_kvview bucket, by outcome.",
            [*labels, "outcome"],
            registry=self.registry,
        )
        self.kv_view_blocks = Gauge(
            "motor_nodeagent_kv_view_blocks",
            "Blocks in the last KV view of each endpoint.",
            [*labels, "endpoint"],
            registry=self.registry,
        )

        self.abnormal_streak = Gauge(
            "motor_nodeagent_abnormal_streak",
            "Consecutive heartbeats with an ABNORMAL endpoint (the node declares itself failed at the threshold).",
            labels,
            registry=self.registry,
        )
        self.heartbeats_dropped = Counter(
            "motor_nodeagent_heartbeats_dropped",
            "Heartbeats not sent because NATS was away (only the latest matters).",
            labels,
            registry=self.registry,
        )
        self.commands_rejected = Counter(
            "motor_nodeagent_commands_rejected",
            "Command messages terminated without taking effect, by reason "
            "(undecodable, not_a_command, handler_failed, stale_term).",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.command_failures = Counter(
            "motor_nodeagent_command_failures",
            "Command handling attempts that raised (each is delivered again or refused).",
            labels,
            registry=self.registry,
        )
        self.command_ack_failures = Counter(
            "motor_nodeagent_command_ack_failures",
            "Acks, naks or terms of commands that NATS did not take within the ack wait.",
            labels,
            registry=self.registry,
        )
        self.consumer_remade = Counter(
            "motor_nodeagent_command_consumer_remade",
            "Times the durable command consumer was made again after it vanished.",
            labels,
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "motor_nodeagent_events_dropped",
            "Events dropped from the outbox because they cannot be published (refused by the "
            "server past the budget, or not encodable), by type.",
            [*labels, "type"],
            registry=self.registry,
        )
        self.publishes_store_full = Counter(
            "motor_nodeagent_publishes_store_full",
            "Publishes the log refused because its store is full (MOTOR at nats.max_bytes, the "
            "server's store at its cap); the event is kept and sent again.",
            labels,
            registry=self.registry,
        )
        self.part_restarts = Counter(
            "motor_nodeagent_part_restarts",
            "Parts of the agent (commands, heartbeats, resync, ...) started again after they failed.",
            [*labels, "part"],
            registry=self.registry,
        )

    def set_status(self, endpoint_id: int, status: EndpointStatus) -> None:
        for s in EndpointStatus:
            self.endpoint_status.labels(self.node_id, str(endpoint_id), s.value).set(1 if s == status else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
