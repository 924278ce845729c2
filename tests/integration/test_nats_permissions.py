"""NATS least privilege: every role tries what it must not do, with its own credentials.

One real nats-server configured as `motor up` configures it (deploy.natsauth: one user per
role, streams.permissions). A forbidden publish or request gets no answer and the server
says why; the tests check both the refusal and that nothing changed (stream sequences,
consumers). Each role also does its own job with the same credentials, through the raw
protocol reader where it reads, so the permission sets are shown complete as well as tight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import KeyNotFoundError

from controller.leader import Lease
from coordinator.kvfeed import fold_delivery
from core import subjects
from core.config import NatsConfig
from core.events import (
    EventBase,
    FaultLevel,
    FaultReported,
    FaultReportedData,
    Heartbeat,
    HeartbeatData,
    InstancesRefreshed,
    InstancesRefreshedData,
    InstanceState,
    InstanceStateChanged,
    InstanceStateChangedData,
    LeaderChanged,
    LeaderChangedData,
    NodeRegistered,
    PrecisionAlarmRaised,
    PrecisionAlarmRaisedData,
)
from core.ids import new_id
from core.kvblocks import KvView, encode_view
from core.state import ClusterState
from deploy.eventfmt import stream_rows
from deploy.natsauth import ClusterAuth, prepare
from nodeagent.commands import durable_name
from streams.checkpoint import save_checkpoint
from streams.connection import NatsOptions, connect
from streams.credentials import PASSWORD_ENV, USER_ENV
from streams.definitions import (
    HB_STREAM,
    KVVIEW_BUCKET,
    LEADER_BUCKET,
    MOTOR_STREAM,
    ensure_streams,
    kv_stream,
)
from streams.errors import NatsUnavailable, PublishTimeout
from streams.jetstream import JetStreamLog
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests import placed
from tests.follower import Follower
from tests.integration.checkpoints import load_checkpoint
from tests.integration.nodeagent_harness import Agent, EventTail, start_command, write_config
from tests.unit.factories import registered

pytestmark = pytest.mark.timeout(240)

NODES = ("n1", "n2", "n3")  # n3 is run by a real node agent


@dataclass
class AuthServer:
    server: EmbeddedNats
    auth: ClusterAuth
    admin: Client
    root: Path
    opened: list[Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    async def login(self, user: str) -> Client:
        nc = await connect(self.auth.options(user, self.url), name=user)
        self.opened.append(nc)
        return nc

    async def last_seqs(self) -> tuple[int, int]:
        js = self.admin.jetstream()
        return (
            (await js.stream_info(MOTOR_STREAM)).state.last_seq,
            (await js.stream_info(HB_STREAM)).state.last_seq,
        )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def authd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthServer]:
    root = tmp_path_factory.mktemp("authd")
    auth = prepare(root, NODES, NatsConfig())
    server = EmbeddedNats(root / "nats", extra_conf=auth.server_conf(), log_file=root / "nats-server.log")
    await server.start()
    try:
        auth.write_contexts(server.url)
        admin = await connect(auth.options("admin", server.url), name="admin")
        await ensure_streams(admin.jetstream())
        # n2's durable command consumer, as its agent makes it: the others must not touch it.
        await admin.jetstream().add_consumer(
            MOTOR_STREAM,
            ConsumerConfig(
                name=durable_name("n2"),
                durable_name=durable_name("n2"),
                ack_policy=AckPolicy.EXPLICIT,
                filter_subject=subjects.node_commands("n2"),
            ),
        )
        try:
            yield AuthServer(server, auth, admin, root)
        finally:
            await admin.close()
    finally:
        await server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def srv(authd: AuthServer) -> AsyncIterator[AuthServer]:
    """The module's server; the clients a test logs in are closed after it."""
    try:
        yield authd
    finally:
        for nc in authd.opened:
            with contextlib.suppress(Exception):
                await nc.close()
        authd.opened.clear()


# --------------------------------------------------------------------------- helpers


def _violations(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage().lower() for r in caplog.records if "violation" in r.getMessage().lower())


async def refused_request(
    nc: Client, subject: str, body: Any = b"", *, caplog: pytest.LogCaptureFixture
) -> None:
    """A request NATS permissions forbid: it gets no answer, and the server names the subject."""
    data = orjson.dumps(body) if isinstance(body, dict) else body
    with pytest.raises((NatsTimeoutError, TimeoutError)):
        await nc.request(subject, data, timeout=1.0)
    assert f'publish to "{subject.lower()}"' in _violations(caplog), _violations(caplog)


async def refused_publish(nc: Client, event: EventBase, *, caplog: pytest.LogCaptureFixture) -> None:
    subject = subjects.for_event(event)
    with pytest.raises(PublishTimeout):
        await Publisher(nc.jetstream(), ack_timeout=1.0).publish(event)
    assert f'publish to "{subject.lower()}"' in _violations(caplog), _violations(caplog)


async def refused_subscribe(nc: Client, subject: str, *, caplog: pytest.LogCaptureFixture) -> None:
    await nc.subscribe(subject)
    deadline = time.monotonic() + 5
    while f'subscription to "{subject.lower()}"' not in _violations(caplog):
        assert time.monotonic() < deadline, _violations(caplog)
        await asyncio.sleep(0.05)  # the -ERR comes asynchronously; nothing to await


async def follows(nc: Client, stream: str, **kw: Any) -> Follower:
    """A follower that reads through the raw reader with these credentials (proves reading)."""
    f = Follower(nc, stream, **kw)
    await asyncio.wait_for(f.start(), 10)
    assert f.transport == "raw"
    return f


def _ev(cls: type[EventBase], data: Any, source: str = "test") -> Any:
    return cls(id=new_id(), ts=time.time(), source=source, data=data)  # type: ignore[call-arg]


def fault(node: str) -> FaultReported:
    return _ev(
        FaultReported, FaultReportedData(fault_id=new_id(), node_id=node, level=FaultLevel.L2, code="X")
    )


def heartbeat(node: str) -> Heartbeat:
    return _ev(Heartbeat, HeartbeatData(node_id=node))


def alarm(d: int) -> PrecisionAlarmRaised:
    return _ev(PrecisionAlarmRaised, PrecisionAlarmRaisedData(alarm_id=new_id(), d_instance_id=d, reason="t"))


def leader(term: int) -> LeaderChanged:
    return _ev(LeaderChanged, LeaderChangedData(leader_id="evil", term=term))


def instance_state(iid: int) -> InstanceStateChanged:
    return _ev(InstanceStateChanged, InstanceStateChangedData(instance_id=iid, state=InstanceState.ISOLATED))


def registration(node: str) -> NodeRegistered:
    return registered(node).model_copy(update={"id": new_id()})


def command(node: str) -> Any:
    return start_command(node, registered(node).data.endpoints)


# --------------------------------------------------------------------------- login


async def test_an_anonymous_connect_and_a_wrong_password_are_refused(srv: AuthServer) -> None:
    with pytest.raises(NatsUnavailable, match=r"(?i)authorization"):
        await connect(srv.url, name="anonymous")
    with pytest.raises(NatsUnavailable, match=r"(?i)authorization"):
        await connect(NatsOptions(urls=[srv.url], user="inspect", password="guess"), name="guess")
    # The context files are the owner's only.
    for f in (srv.root / "auth").iterdir():
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert (srv.root / "auth").stat().st_mode & 0o777 == 0o700
    assert (srv.root / "nats" / "nats-server.conf").stat().st_mode & 0o777 == 0o600


async def test_a_login_from_the_environment_gets_replies_in_its_own_inbox(srv: AuthServer) -> None:
    """`MOTOR_NATS_USER`/`MOTOR_NATS_PASSWORD`, no context file: the user may subscribe only
    under `_INBOX.<user>.>`, so its replies (every JetStream API call) must be sent there."""
    env = {USER_ENV: "inspect", PASSWORD_ENV: srv.auth.credentials("inspect").password or ""}
    # A process reading its config (controller, coordinator, node agent).
    opts = NatsOptions.from_config(NatsConfig(), [srv.url], env=env)
    nc = await connect(opts, name="env-login")
    srv.opened.append(nc)
    info = await asyncio.wait_for(nc.jetstream().stream_info(MOTOR_STREAM), 10)
    assert info.config.name == MOTOR_STREAM
    assert opts.inbox_prefix == "_INBOX.inspect"
    # A command line (its flags default to the same variables).
    child = {k: v for k, v in os.environ.items() if not k.startswith("MOTOR_NATS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", "events", "ls", "--nats-url", srv.url, "--root", str(srv.root / "none"),
        env={**child, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert MOTOR_STREAM in out.decode()


# --------------------------------------------------------------------------- node agent


async def test_a_node_agent_cannot_publish_another_nodes_command_nor_delete_a_stream(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    before = await srv.last_seqs()
    n1 = await srv.login("nodeagent-n1")
    await refused_publish(n1, command("n2"), caplog=caplog)  # motor.cmd.n2.start
    await refused_publish(n1, command("n1"), caplog=caplog)  # not even its own: commands are the controller's
    for verb in ("STREAM.DELETE", "STREAM.PURGE", "STREAM.UPDATE"):
        await refused_request(n1, f"$JS.API.{verb}.{MOTOR_STREAM}", caplog=caplog)
    await refused_request(n1, f"$JS.API.STREAM.DELETE.{HB_STREAM}", caplog=caplog)
    await refused_request(n1, f"$JS.API.STREAM.MSG.DELETE.{MOTOR_STREAM}", {"seq": 1}, caplog=caplog)
    js = srv.admin.jetstream()
    assert (await js.stream_info(MOTOR_STREAM)).config.name == MOTOR_STREAM
    assert await srv.last_seqs() == before


async def test_a_node_agent_cannot_speak_for_another_node_or_the_controller(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    before = await srv.last_seqs()
    n1 = await srv.login("nodeagent-n1")
    for ev in (registration("n2"), heartbeat("n2"), fault("n2"), instance_state(1), leader(99), alarm(1)):
        await refused_publish(n1, ev, caplog=caplog)
    # Not the lease either (KV put on motor_leader).
    await refused_request(n1, "$KV.motor_leader.leader", b'{"id": "n1", "term": 99}', caplog=caplog)
    assert await srv.last_seqs() == before


async def test_a_node_agent_writes_only_its_own_endpoints_kv_views_and_a_coordinator_reads_them(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    """`$KV.motor_kvview.<node>.>` is the node's own (nodeagent.kvwatch); coordinators only read."""
    caplog.set_level(logging.WARNING)
    n1 = await srv.login("nodeagent-n1")
    view = encode_view(16, [1, 2, 3])
    assert await JetStreamLog(n1).kv(KVVIEW_BUCKET).put("n1.0", view) > 0
    await refused_request(n1, f"$KV.{KVVIEW_BUCKET}.n2.0", view, caplog=caplog)
    coord = await srv.login("coordinator")
    await refused_request(coord, f"$KV.{KVVIEW_BUCKET}.n1.0", view, caplog=caplog)
    kv = KvView()
    consumer = JetStreamLog(coord).ordered(kv_stream(KVVIEW_BUCKET))
    await consumer.start()
    try:
        for d in await asyncio.wait_for(consumer.next_batch(), 10):
            fold_delivery(kv, d)
    finally:
        await consumer.close()
    got = kv.get("n1/0")
    assert got is not None and got.blocks == frozenset({1, 2, 3})
    assert kv.keys() == ["n1/0"]


async def test_a_node_agent_cannot_touch_another_nodes_command_consumer(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    n1 = await srv.login("nodeagent-n1")
    theirs = durable_name("n2")
    hijack = {
        "name": theirs,
        "durable_name": theirs,
        "ack_policy": "explicit",
        "filter_subject": "motor.cmd.n1.>",
    }
    body = {"stream_name": MOTOR_STREAM, "config": hijack}
    await refused_request(
        n1, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.{theirs}.motor.cmd.n1.>", body, caplog=caplog
    )
    await refused_request(n1, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.{theirs}", body, caplog=caplog)
    # The nameless legacy form takes the name from the body: allowed to nobody.
    await refused_request(n1, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}", body, caplog=caplog)
    await refused_request(n1, f"$JS.API.CONSUMER.DURABLE.CREATE.{MOTOR_STREAM}.{theirs}", body, caplog=caplog)
    await refused_request(
        n1, f"$JS.API.CONSUMER.MSG.NEXT.{MOTOR_STREAM}.{theirs}", {"batch": 1}, caplog=caplog
    )
    await refused_request(n1, f"$JS.API.CONSUMER.DELETE.{MOTOR_STREAM}.{theirs}", caplog=caplog)
    # Reading another node's commands through an ephemeral consumer of its own: refused too.
    spy = {"name": "spy", "deliver_subject": "_INBOX.nodeagent-n1.spy", "ack_policy": "none",
           "filter_subject": "motor.cmd.n2.>"}  # fmt: skip
    await refused_request(
        n1, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.spy.motor.cmd.n2.>", {"stream_name": MOTOR_STREAM, "config": spy},
        caplog=caplog,
    )  # fmt: skip
    await refused_subscribe(n1, "motor.cmd.>", caplog=caplog)
    await refused_subscribe(n1, "_INBOX.>", caplog=caplog)  # other users' replies
    info = await srv.admin.jetstream().consumer_info(MOTOR_STREAM, theirs)
    assert info.config.filter_subject == "motor.cmd.n2.>"


@pytest.mark.parametrize("user", ["controller", "coordinator", "operator", "inspect"])
async def test_no_other_role_can_repoint_or_drain_a_nodes_command_consumer(
    srv: AuthServer, caplog: pytest.LogCaptureFixture, user: str
) -> None:
    caplog.set_level(logging.WARNING)
    nc = await srv.login(user)
    theirs = durable_name("n2")
    body = {"stream_name": MOTOR_STREAM, "config": {"name": theirs, "durable_name": theirs,
            "ack_policy": "explicit", "filter_subject": "motor.cmd.n9.>"}}  # fmt: skip
    await refused_request(nc, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.{theirs}", body, caplog=caplog)
    await refused_request(
        nc, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.{theirs}.motor.cmd.n9.>", body, caplog=caplog
    )
    await refused_request(nc, f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}", body, caplog=caplog)
    await refused_request(
        nc, f"$JS.API.CONSUMER.MSG.NEXT.{MOTOR_STREAM}.{theirs}", {"batch": 1}, caplog=caplog
    )
    await refused_request(nc, f"$JS.API.CONSUMER.DELETE.{MOTOR_STREAM}.{theirs}", caplog=caplog)
    await refused_request(nc, f"$JS.API.STREAM.DELETE.{MOTOR_STREAM}", caplog=caplog)
    info = await srv.admin.jetstream().consumer_info(MOTOR_STREAM, theirs)
    assert info.config.filter_subject == "motor.cmd.n2.>"


async def test_a_real_node_agent_runs_with_its_own_credentials_only(
    srv: AuthServer, tmp_path: Path, agents: list[Agent]
) -> None:
    """Registers, heartbeats, takes a command from the controller user, reports READY."""
    watch = await srv.login("inspect")
    tail = await EventTail(watch).start()
    try:
        cfg = write_config(tmp_path / "cluster.json")
        env = srv.auth.child_env({}, "nodeagent-n3")
        agent = Agent(tmp_path, cfg, "n3", srv.url, env=env).start()
        agents.append(agent)
        reg = await tail.wait(lambda e: isinstance(e, NodeRegistered) and e.data.node_id == "n3", within=60)
        ctl = await srv.login("controller")
        cmd = start_command("n3", reg.data.endpoints, instance_id=5)
        await Publisher(ctl.jetstream()).publish(cmd)
        await tail.wait(
            lambda e: e.type == "command.applied" and e.data.command_id == cmd.data.command_id, 60
        )
        await tail.wait(lambda e: e.type == "endpoint.status_changed" and e.data.status == "READY", 60)
        hb = await follows(watch, HB_STREAM, filter_subject=subjects.heartbeat("n3"))
        try:
            rec = await asyncio.wait_for(anext(aiter(hb)), 30)
            assert rec.event.data.node_id == "n3"
        finally:
            await hb.close()
    finally:
        await tail.close()
    log = (srv.root / "nats-server.log").read_text().splitlines()
    assert not [line for line in log if "user:nodeagent-n3" in line and "Violation" in line]


# --------------------------------------------------------------------------- controller


async def test_the_controller_sends_commands_and_decisions_and_holds_the_lease(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ctl = await srv.login("controller")
    js = ctl.jetstream()
    pub = Publisher(js)
    for ev in (command("n1"), instance_state(1), leader(1), fault("n1")):
        assert await pub.publish(ev) > 0
    # The appender's pipelined batch: its acks come to an inbox of the controller's own.
    batch = await pub.publish_batch([command("n1"), instance_state(1)])
    assert all(isinstance(seq, int) and seq > 0 for seq in batch), batch
    last = await js.get_last_msg(MOTOR_STREAM, placed.command("n1", "start"))  # the appender's guard
    assert last.seq > 0
    lease = Lease(JetStreamLog.of(js).kv(LEADER_BUCKET), "c1", ttl=5.0)
    assert await lease.acquire(term=1)
    assert await lease.renew()
    assert (await lease.holder()) is not None
    await lease.release()
    await save_checkpoint(JetStreamLog.of(js), "controller-test", ClusterState(last_seq=3))
    assert (await load_checkpoint(JetStreamLog.of(js), "controller-test")) is not None
    motor, hb = await follows(ctl, MOTOR_STREAM), await follows(ctl, HB_STREAM)
    await motor.close()
    await hb.close()
    before = await srv.last_seqs()
    for ev in (registration("n1"), heartbeat("n1")):
        await refused_publish(ctl, ev, caplog=caplog)
    await refused_request(ctl, f"$JS.API.STREAM.DELETE.{MOTOR_STREAM}", caplog=caplog)
    assert await srv.last_seqs() == before


# --------------------------------------------------------------------------- coordinator


async def test_the_coordinator_publishes_refresh_precision_and_its_own_faults_only(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    co = await srv.login("coordinator")
    js = co.jetstream()
    refresh = _ev(InstancesRefreshed, InstancesRefreshedData(ids=(1,), instances=({"id": 1},)))
    assert await Publisher(js).publish(refresh) > 0
    assert await Publisher(js).publish(alarm(2)) > 0
    for subject in (placed.circuit("n1"), placed.streams(None, 7)):  # its own fault decisions
        assert (await js.publish(subject, b"{}")).seq > 0
    f = await follows(co, MOTOR_STREAM, filter_subject=subjects.ALL_EVENTS)
    await f.close()
    await (await follows(co, HB_STREAM)).close()
    before = await srv.last_seqs()
    for ev in (command("n1"), fault("n1"), instance_state(1), registration("n1")):
        await refused_publish(co, ev, caplog=caplog)
    assert await srv.last_seqs() == before


# --------------------------------------------------------------------------- inspect, operator


async def test_inspect_reads_everything_and_writes_nothing(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    await Publisher(srv.admin.jetstream()).publish(fault("n1"))
    nc = await srv.login("inspect")
    rows = await stream_rows(nc)
    assert {r["stream"] for r in rows} >= {MOTOR_STREAM, HB_STREAM}
    f = await follows(nc, MOTOR_STREAM)
    rec = await asyncio.wait_for(anext(aiter(f)), 30)
    assert rec.seq == 1
    await f.close()
    await (await follows(nc, HB_STREAM)).close()
    await nc.subscribe("motor.evt.>")  # `motor events sub`
    await nc.flush()
    kv = await nc.jetstream().key_value("motor_leader")
    with contextlib.suppress(KeyNotFoundError):
        await kv.get("leader")
    before = await srv.last_seqs()
    for ev in (fault("n1"), alarm(1), command("n1"), heartbeat("n1")):
        await refused_publish(nc, ev, caplog=caplog)
    await refused_request(nc, "$KV.motor_leader.leader", b"{}", caplog=caplog)
    await refused_request(nc, f"$JS.API.STREAM.PURGE.{MOTOR_STREAM}", caplog=caplog)
    # A push consumer pointed into another stream's subjects lands nothing there.
    evil = {"name": "evil", "deliver_subject": subjects.heartbeat("n1"), "ack_policy": "none"}
    resp = await nc.request(
        f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.evil",
        orjson.dumps({"stream_name": MOTOR_STREAM, "config": evil}),
        5,
    )
    assert b"error" not in resp.data or b"cycle" in resp.data
    await asyncio.sleep(3)  # a delivery would come within its first heartbeat; nothing to await
    assert await srv.last_seqs() == before
    assert "subscription" not in _violations(caplog)


async def test_the_operator_reports_faults_and_alarms_but_sends_no_commands(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    op = await srv.login("operator")
    pub = Publisher(op.jetstream())
    assert await pub.publish(fault("n1")) > 0
    assert await pub.publish(alarm(3)) > 0
    before = await srv.last_seqs()
    for ev in (command("n1"), instance_state(1), registration("n1")):
        await refused_publish(op, ev, caplog=caplog)
    assert await srv.last_seqs() == before


async def test_a_consumer_pointed_at_another_readers_inbox_injects_nothing(srv: AuthServer) -> None:
    """Whoever may create consumers may name any deliver subject, and consumer listings show
    readers' inboxes: the reader hands out its own consumer's messages only."""
    pub = Publisher(srv.admin.jetstream())
    old = [await pub.publish(fault("n1")) for _ in range(3)]
    ctl = await srv.login("controller")
    victim = await follows(ctl, MOTOR_STREAM, start_seq=old[-1] + 1)  # nothing yet: at consumer seq 0
    try:
        ins = await srv.login("inspect")
        listing = orjson.loads((await ins.request(f"$JS.API.CONSUMER.LIST.{MOTOR_STREAM}", b"{}", 5)).data)
        inbox = next(
            c["config"]["deliver_subject"]
            for c in listing["consumers"]
            if c["config"].get("deliver_subject", "").startswith("_INBOX.controller.")
        )
        evil = {"name": "evil", "deliver_subject": inbox, "ack_policy": "none",
                "deliver_policy": "by_start_sequence", "opt_start_seq": old[0]}  # fmt: skip
        body = orjson.dumps({"stream_name": MOTOR_STREAM, "config": evil})
        resp = await ins.request(f"$JS.API.CONSUMER.CREATE.{MOTOR_STREAM}.evil", body, 5)
        assert b'"error"' not in resp.data, resp.data
        new = await pub.publish(fault("n1"))
        rec = await asyncio.wait_for(anext(aiter(victim)), 30)
        assert rec.seq == new, f"got seq {rec.seq} (an old event, delivered by 'evil'), want {new}"
        assert victim._consumer.foreign >= 1
    finally:
        await victim.close()


# --------------------------------------------------------------------------- subject and data


async def test_an_event_whose_data_names_another_entity_than_its_subject_is_skipped(srv: AuthServer) -> None:
    """Permissions guard subjects: n1 registering as n2 on n1's own subject is not believed."""
    js = srv.admin.jetstream()
    forged = registration("n2")
    ack = await js.publish(placed.node("n1"), forged.model_dump_json().encode())
    good = await Publisher(js).publish(registration("n1"))
    f = Follower(srv.admin, MOTOR_STREAM, start_seq=ack.seq)
    try:
        rec = await asyncio.wait_for(anext(aiter(f)), 30)
        assert rec.seq == good and rec.event.data.node_id == "n1"
        assert f.skip_reasons == {"wrong_subject": 1}
    finally:
        await f.close()


# --------------------------------------------------------------------------- TLS


async def test_required_tls_refuses_plaintext_and_serves_tls_first_clients(tmp_path: Path) -> None:
    auth = await asyncio.to_thread(prepare, tmp_path, NODES, NatsConfig(require_tls=True))  # openssl
    assert auth.tls is not None and auth.tls.ca is not None and auth.tls.ca.startswith(str(tmp_path))
    server = EmbeddedNats(tmp_path / "nats", extra_conf=auth.server_conf())
    await server.start()
    nc = None
    try:
        auth.write_contexts(server.url)
        plain = auth.options("admin", server.url)
        plain.tls_first, plain.tls_ca = False, None
        with pytest.raises(NatsUnavailable):
            await connect(plain, name="plaintext", connect_timeout=2.0)
        admin = await connect(auth.options("admin", server.url), name="admin-tls")
        await ensure_streams(admin.jetstream())
        await Publisher(admin.jetstream()).publish(fault("n1"))
        await admin.close()
        nc = await connect(auth.options("inspect", server.url), name="inspect-tls")
        f = await follows(nc, MOTOR_STREAM)  # the raw reader opens TLS first too
        rec = await asyncio.wait_for(anext(aiter(f)), 30)
        assert rec.event.type == "fault.reported"
        await f.close()
    finally:
        if nc is not None:
            await nc.close()
        await server.stop()


async def test_a_node_agents_fold_checks_its_last_event_after_a_reconnect_with_its_own_rights(
    srv: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A fold made again after a reconnect checks that the event it folded last is still in the
    stream (a lost tail written over). A node agent may not get a message by sequence (it could
    read another node's commands): its fold asks through its own filter, and is checked without
    a permission violation (it asked $JS.API.STREAM.MSG.GET.MOTOR every 2 s, refused, for good)."""
    from streams.livefold import LiveFold
    from streams.log import Range

    class Watched(JetStreamLog):
        asked: list[Range] = []

        def read(self, stream: str, span: Range) -> Any:
            self.asked.append(span)
            return super().read(stream, span)

    caplog.set_level(logging.WARNING)
    await Publisher(srv.admin.jetstream()).publish(registration("n1"))
    n1 = await srv.login("nodeagent-n1")
    folded: list[Any] = []
    motor = Watched(n1)
    fold = LiveFold(
        motor,
        lambda rec: folded.append(rec),
        filter_subject=subjects.ALL_EVENTS,
        name="nodeagent/n1 resync",
        check_interval=0.2,
    )
    await fold.start()
    try:
        await asyncio.wait_for(fold.caught_up.wait(), 20)
        assert folded
        assert fold._motor is not None
        await fold._restart_lane(fold._motor)  # what a reconnect does: the check is asked for
        deadline = time.monotonic() + 20
        while not (fold.checked and any(a.until_seq is not None for a in motor.asked)):
            assert time.monotonic() < deadline, f"the fold was never checked: {_violations(caplog)}"
            await asyncio.sleep(0.05)
    finally:
        await fold.close()
    log = (srv.root / "nats-server.log").read_text().splitlines()
    assert not [line for line in log if "user:nodeagent-n1" in line and "MSG.GET" in line]
