"""NATS credentials, permission sets and leader terms: the pure parts, as tables.

The same claims against the real server are in tests/integration/test_nats_permissions.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from core import codec, subjects
from core.config import NatsConfig, TLSConfig
from core.errors import ConfigError, WrongSubject
from core.events import EVENT_CLASSES, EndpointStatus, LeaderChanged, LeaderChangedData
from deploy.natsauth import _same_server, discover, prepare, user_for_child
from nodeagent import runstate
from nodeagent.command_handler import check_term
from nodeagent.errors import CommandRefusal
from streams.connection import NatsOptions
from streams.credentials import Credentials, CredentialsError, load_context, merge, save_context
from streams.permissions import cluster_users, node_agent
from streams.server import authorization_conf, find_nats_server, tls_conf
from tests import placed
from tests.unit.controller_log import Log, config
from tests.unit.factories import registered

# --------------------------------------------------------------------------- subject vs data


def _fake(etype: str, node: str = "n1", iid: int = 4) -> Any:
    """An event of type `etype` whose data names every entity field any placement reads."""
    data = SimpleNamespace(
        node_id=node,
        instance_id=iid,
        d_instance_id=iid,
        entity=f"e{node}{iid}",
        rollout_id=f"r{iid}",
        role=f"role{iid}",
        op_id=f"op{iid}",
    )
    return SimpleNamespace(type=etype, SUBJECT=EVENT_CLASSES[etype].SUBJECT, data=data)


@pytest.mark.parametrize("etype", sorted(EVENT_CLASSES))
def test_matches_agrees_with_for_event_for_every_event_type(etype: str) -> None:
    ev = _fake(etype)
    assert subjects.matches(subjects.for_event(ev), ev)
    other = subjects.for_event(_fake(etype, node="n2", iid=5))
    if other != subjects.for_event(ev):  # leader and refresh subjects name no entity
        assert not subjects.matches(other, ev)


def test_decode_with_the_subject_refuses_data_that_names_another_entity() -> None:
    data = codec.encode(registered("n2"))
    assert codec.decode(data, placed.node("n2")).data.node_id == "n2"  # type: ignore[union-attr]
    with pytest.raises(WrongSubject, match=r"motor\.evt\.node\.n2"):
        codec.decode(data, placed.node("n1"))
    assert codec.decode(data).data.node_id == "n2"  # type: ignore[union-attr]  # no subject: not judged


# --------------------------------------------------------------------------- leader terms


@pytest.mark.parametrize(
    ("term", "newest", "refused"),
    [(0, 0, False), (1, 0, False), (2, 2, False), (3, 2, False), (1, 2, True), (0, 1, True)],
)
def test_check_term(term: int, newest: int, refused: bool) -> None:
    if refused:
        with pytest.raises(CommandRefusal) as exc:
            check_term(term, newest)
        assert exc.value.code == "stale_term"
    else:
        check_term(term, newest)


def test_a_node_past_the_largest_seen_term_says_the_largest_and_its_refusal_decodes() -> None:
    """Issue 24: the refusal of a node that obeyed a term past MAX_SEEN_TERM would not decode.
    Naming the bound still moves the leader past it; from there each refusal moves it on."""
    from core.bounds import MAX_SEEN_TERM, MAX_TERM
    from nodeagent.command_handler import answer
    from tests.unit.factories import start_cmd

    with pytest.raises(CommandRefusal) as exc:
        check_term(MAX_SEEN_TERM, MAX_TERM)
    assert exc.value.refusal.seen_term == MAX_SEEN_TERM
    refused = answer("n1", "nodeagent/n1", start_cmd("n1", 1), exc.value.refusal)
    assert codec.decode(codec.encode(refused)) == refused


def test_commands_carry_the_term_of_the_leader_that_decides_them() -> None:
    log = Log(config(union=1))
    log.add(
        LeaderChanged(
            id="l7", ts=log.now, source="controller/c1", data=LeaderChangedData(leader_id="c1", term=7)
        )
    )
    log.register("n1")
    log.bring_up()
    log.status("n1", 0, EndpointStatus.DEAD, reason="killed")
    log.settle()
    commands = [ev for _, ev in log.events if ev.type in ("command.start", "command.stop")]
    assert {ev.type for ev in commands} == {"command.start", "command.stop"}
    assert {ev.data.term for ev in commands} == {7}  # type: ignore[attr-defined]


def test_a_command_without_a_leader_in_the_log_has_term_0() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.settle()
    starts = [ev for _, ev in log.events if ev.type == "command.start"]
    assert starts and all(ev.data.term == 0 for ev in starts)  # type: ignore[attr-defined]


def test_old_run_state_files_have_term_0_and_the_term_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps({"node_id": "n1", "done": [["c1", "applied"]]}))
    assert runstate.load(path, "n1").term == 0
    runstate.save(path, runstate.RunState(node_id="n1", term=5))
    assert runstate.load(path, "n1").term == 5


# --------------------------------------------------------------------------- credentials


def test_context_files_round_trip_owner_only(tmp_path: Path) -> None:
    creds = Credentials(url="nats://h:1", user="u", password="p", inbox_prefix="_INBOX.u", tls_first=True)
    save_context(tmp_path / "u.json", creds, "test")
    assert (tmp_path / "u.json").stat().st_mode & 0o777 == 0o600
    assert load_context(tmp_path / "u.json") == creds
    raw = orjson.loads((tmp_path / "u.json").read_bytes())
    assert raw["creds"] == "" and raw["description"] == "test"  # the `nats` CLI's context shape


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{nope", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"user": 3}', "'user' must be a string"),
        (b'{"password": "p"}', "a password without a user"),
    ],
)
def test_bad_context_files_are_named(tmp_path: Path, body: bytes, error: str) -> None:
    (tmp_path / "c.json").write_bytes(body)
    with pytest.raises(CredentialsError, match=error) as exc:
        load_context(tmp_path / "c.json")
    assert "c.json" in str(exc.value)
    with pytest.raises(CredentialsError, match="cannot read"):
        load_context(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("layers", "want"),
    [
        # The first layer that logs in gives the whole login: never user from one, token from another.
        ([Credentials(user="env", password="e"), Credentials(token="t", inbox_prefix="_INBOX.x")],
         Credentials(user="env", password="e", inbox_prefix="_INBOX.env")),
        ([Credentials(), Credentials(user="f", password="p", inbox_prefix="_INBOX.f")],
         Credentials(user="f", password="p", inbox_prefix="_INBOX.f")),
        # URL and TLS files fill in from whichever layer has them.
        ([Credentials(creds="/c"), Credentials(url="nats://a:1", ca="/ca"), Credentials(url="nats://b:2")],
         Credentials(creds="/c", url="nats://a:1", ca="/ca")),
        ([Credentials(), Credentials(tls_first=True)], Credentials(tls_first=True)),
        # A user login names its inbox, or gets the one Motor's permissions give it.
        ([Credentials(user="u", password="p", inbox_prefix="_INBOX_x")],
         Credentials(user="u", password="p", inbox_prefix="_INBOX_x")),
        ([Credentials(user="a.b", password="p")], Credentials(user="a.b", password="p")),
        ([Credentials(token="t")], Credentials(token="t")),
    ],
)  # fmt: skip
def test_merge(layers: list[Credentials], want: Credentials) -> None:
    assert merge(*layers) == want


def test_options_from_config_env_and_context(tmp_path: Path) -> None:
    ctx = tmp_path / "ctl.json"
    save_context(
        ctx,
        Credentials(
            url="nats://10.0.0.9:4222", user="controller", password="s", inbox_prefix="_INBOX.controller"
        ),
    )
    cfg = NatsConfig(user="cfg", password="c", context_file=None)
    assert NatsOptions.from_config(cfg, env={}).user == "cfg"
    opts = NatsOptions.from_config(cfg, env={"MOTOR_NATS_CONTEXT": str(ctx)})
    assert (opts.user, opts.password, opts.inbox_prefix) == ("controller", "s", "_INBOX.controller")
    assert opts.urls == ["nats://10.0.0.9:4222"]  # the context's URL over the config's
    assert NatsOptions.from_config(cfg, ["nats://x:1"], env={"MOTOR_NATS_CONTEXT": str(ctx)}).urls == [
        "nats://x:1"
    ]
    env = {"MOTOR_NATS_CONTEXT": str(ctx), "MOTOR_NATS_USER": "op", "MOTOR_NATS_PASSWORD": "o"}
    opts = NatsOptions.from_config(cfg, env=env)
    assert (opts.user, opts.password, opts.inbox_prefix) == ("op", "o", "_INBOX.op")
    env["MOTOR_NATS_INBOX_PREFIX"] = "_INBOX.mine"
    assert NatsOptions.from_config(cfg, env=env).inbox_prefix == "_INBOX.mine"
    assert NatsOptions.from_config(cfg, env={}).inbox_prefix == "_INBOX.cfg"
    opts = NatsOptions.from_config(NatsConfig(context_file=str(ctx)), env={})
    assert opts.user == "controller"
    tls = NatsOptions.from_config(NatsConfig(require_tls=True), env={})
    assert tls.tls_first and tls.connect_kwargs()["tls_handshake_first"] is True


@pytest.mark.parametrize(
    "url", ["nats://user:secret@10.0.0.1:4222", "tls://secret@h:1", "nats://10.0.0.1:4222"]
)
def test_urls_are_shown_without_secrets(url: str) -> None:
    shown = NatsOptions(urls=[url, "nats://b:2"]).shown_urls()
    assert "secret" not in shown and ("10.0.0.1:4222" in shown or "h:1" in shown)


def test_config_wants_server_cert_and_key_together() -> None:
    with pytest.raises(ValueError, match="server_cert_file and server_key_file"):
        TLSConfig(server_cert_file="/c")
    with pytest.raises(ConfigError):
        from core.config import config_from_dict

        config_from_dict({"union": {}, "nats": {"require_tls": "maybe"}})


# --------------------------------------------------------------------------- motor up's files


@pytest.mark.parametrize(
    ("child", "user"),
    [("controller-c1", "controller"), ("coordinator", "coordinator"), ("coordinator-2", "coordinator"),
     ("nodeagent-union-0", "nodeagent-union-0")],
)  # fmt: skip
def test_each_child_logs_in_as_its_role(child: str, user: str) -> None:
    assert user_for_child(child) == user
    assert user_for_child("engine") is None


def test_prepare_keeps_passwords_and_discover_matches_the_server(tmp_path: Path) -> None:
    auth = prepare(tmp_path, ["n1", "n2"], NatsConfig())
    auth.write_contexts("nats://127.0.0.1:4333")
    names = {u.name for u, _ in auth.users}
    assert names == {
        "admin",
        "controller",
        "coordinator",
        "operator",
        "inspect",
        "nodeagent-n1",
        "nodeagent-n2",
    }
    assert len({pw for _, pw in auth.users}) == len(auth.users)
    again = prepare(tmp_path, ["n1", "n2", "n3"], NatsConfig())
    assert (
        dict((u.name, pw) for u, pw in again.users).items()
        >= dict((u.name, pw) for u, pw in auth.users).items()
    )
    env = auth.child_env({"MOTOR_NATS_PASSWORD": "operator's", "PATH": "/bin"}, "nodeagent-n1")
    assert env == {"PATH": "/bin", "MOTOR_NATS_CONTEXT": str(tmp_path / "auth" / "nodeagent-n1.json")}
    assert auth.child_env({"MOTOR_NATS_PASSWORD": "x"}, "engine-x") == {"MOTOR_NATS_PASSWORD": "x"}

    found = discover(tmp_path, "inspect", None)
    assert found is not None and found.user == "inspect" and found.url == "nats://127.0.0.1:4333"
    assert discover(tmp_path, "inspect", ["nats://localhost:4333"]) is not None
    assert discover(tmp_path, "inspect", ["nats://127.0.0.1:4222"]) is None  # another server: never sent
    assert discover(tmp_path / "nowhere", "inspect", None) is None
    assert _same_server("nats://u:p@127.0.0.1:1", "nats://127.0.0.1:1")


def test_the_rendered_users_are_valid_nats_server_config(tmp_path: Path) -> None:
    """`nats-server -t` parses what motor up writes (the TLS block is started for real in
    tests/integration/test_nats_permissions.py)."""
    users = [(u, f"pw-{u.name}") for u in cluster_users(["union-0", "decode-0"])]
    path = tmp_path / "test.conf"
    path.write_text(f"port: -1\n{authorization_conf(users)}\n")
    done = subprocess.run(
        [find_nats_server(), "-t", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "handshake_first: true" in tls_conf("/s.pem", "/s.key")


def test_a_node_agent_may_write_only_its_own_subjects() -> None:
    perms = node_agent("n1", ["n1", "n2"]).permissions
    assert perms is not None
    evt = [s for s in perms.publish if s.startswith("motor.")]
    assert evt == [
        "motor.evt.node.n1",
        "motor.evt.endpoint.n1",
        "motor.evt.fault.n1",
        "motor.evt.snapshot.n1",
        "motor.evt.drain.n1",
        "motor.hb.n1",
    ]
    assert "$JS.API.CONSUMER.MSG.NEXT.MOTOR.nodeagent-n2" in perms.publish_deny
    assert not any("nodeagent-n1" in s for s in perms.publish_deny)
    assert perms.subscribe == ("_INBOX.nodeagent-n1.>",)
    assert not any(
        s == "$JS.API.CONSUMER.CREATE.MOTOR"
        for u in cluster_users(["n1"])
        if u.permissions
        for s in u.permissions.publish
    )


def test_a_type_no_subject_rule_places_is_not_judged() -> None:
    assert subjects.matches(
        "motor.evt.coordinator.c1", SimpleNamespace(type="coordinator.route_failed", data=None)
    )


def test_a_subject_outside_motors_is_not_judged() -> None:
    """Another stream read the same way (LiveFold is generic) holds no Motor subjects."""
    assert subjects.matches("aged.n7", _fake("endpoint.status_changed", node="n1"))
    assert not subjects.matches("motor.evt.endpoint.n7", _fake("endpoint.status_changed", node="n1"))
