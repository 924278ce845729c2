"""Secrets (issue 12, item 5): masked wherever they are shown, taken from the environment or a
file, refused with a message naming the field when unusable.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from core.config import config_from_dict
from core.errors import ConfigError
from core.redact import MASK, redact, redact_url, secret_name
from core.secrets import resolve_secrets
from deploy.cli import main
from deploy.common import load_config_file

SECRET_CONFIG = {
    "nats": {"urls": ["nats://motor:natspw-1@10.0.0.2:4222", "nats://10.0.0.3:4222"], "token": "natstok-1"},
    "controller": {"api_keys": ["ctl-key-1"]},
    "coordinator": {"api_keys": ["user-key-1", "user-key-2"], "admin_keys": ["admin-key-1"]},
    "union": {
        "env": {"HF_TOKEN": "hf-secret-1", "OMP_NUM_THREADS": "2"},
        "engine_config": {"api_key": "eng-1"},
    },
}
SECRETS = (
    "natspw-1",
    "natstok-1",
    "ctl-key-1",
    "user-key-1",
    "user-key-2",
    "admin-key-1",
    "hf-secret-1",
    "eng-1",
)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True),
        ("token", True),
        ("api_keys", True),
        ("admin_keys", True),
        ("HF_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("auth_token", True),
        ("authorization", True),
        ("client_secret", True),
        ("credentials", True),
        ("max_tokens", False),
        ("key_file", False),
        ("api_keys_file", False),
        ("tokens", False),
        ("bootstrap_port", False),
        ("model", False),
        ("OMP_NUM_THREADS", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://u:pw@h:4222", "nats://u:***@h:4222"),
        ("nats://tok@h:4222", "nats://***@h:4222"),
        ("http://h:1/p?q=1", "http://h:1/p?q=1"),
        ("tls://a:b:c@h", "tls://a:***@h"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_walks_nested_values_and_keeps_the_shape() -> None:
    got = redact(
        {"a": {"password": "x", "n": 1, "list": [{"token": "t"}, "http://u:p@h/"]}, "api_keys": ["k1", "k2"]}
    )
    assert got == {
        "a": {"password": MASK, "n": 1, "list": [{"token": MASK}, "http://u:***@h/"]},
        "api_keys": [MASK, MASK],
    }


def test_config_show_masks_every_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(SECRET_CONFIG))
    assert main(["config", "show", str(path)]) == 0
    out = capsys.readouterr().out
    for secret in SECRETS:
        assert secret not in out, secret
    shown = orjson.loads(out)
    assert shown["coordinator"]["api_keys"] == [MASK, MASK]
    assert shown["nats"]["urls"][0] == "nats://motor:***@10.0.0.2:4222"
    assert shown["nats"]["token"] == MASK
    assert shown["union"]["env"] == {"HF_TOKEN": MASK, "OMP_NUM_THREADS": "2"}


def _read(files: dict[str, str]):  # type: ignore[no-untyped-def]
    def read(path: str) -> str:
        if path not in files:
            raise OSError(2, "No such file or directory")
        return files[path]

    return read


def test_keys_come_from_the_environment_over_the_file() -> None:
    cfg = config_from_dict({"union": {}, "coordinator": {"api_keys": ["in-file"]}})
    env = {
        "MOTOR_COORDINATOR_API_KEYS": "k1, k2\nk3",
        "MOTOR_COORDINATOR_ADMIN_KEYS": "a1",
        "MOTOR_CONTROLLER_API_KEYS": "c1",
        "MOTOR_NATS_PASSWORD": "pw",
        "MOTOR_NATS_TOKEN": "tok",
    }
    got = resolve_secrets(cfg, env, _read({}))
    assert got.coordinator.api_keys == ["k1", "k2", "k3"]
    assert got.coordinator.admin_keys == ["a1"]
    assert got.controller.api_keys == ["c1"]
    assert (got.nats.password, got.nats.token) == ("pw", "tok")
    # Nothing set: the config stands as written.
    assert resolve_secrets(cfg, {}, _read({})) == cfg


def test_keys_come_from_files_named_in_the_config() -> None:
    cfg = config_from_dict(
        {
            "union": {},
            "coordinator": {"api_keys_file": "/s/keys", "admin_keys_file": "/s/admin"},
            "controller": {"api_keys_file": "/s/ctl"},
            "nats": {"user": "motor", "password_file": "/s/pw", "token_file": "/s/tok"},
        }
    )
    files = {
        "/s/keys": "# users\nk1\n\n  k2  \n",
        "/s/admin": "a1\n",
        "/s/ctl": "c1",
        "/s/pw": "pw-from-file\n",
        "/s/tok": "tok\n",
    }
    got = resolve_secrets(cfg, {}, _read(files))
    assert got.coordinator.api_keys == ["k1", "k2"]
    assert got.coordinator.admin_keys == ["a1"]
    assert got.controller.api_keys == ["c1"]
    assert (got.nats.password, got.nats.token) == ("pw-from-file", "tok")


@pytest.mark.parametrize(
    ("raw", "files", "env", "needles"),
    [
        ({"coordinator": {"api_keys_file": "/nope"}}, {}, {}, ["coordinator.api_keys_file", "/nope"]),
        (
            {"coordinator": {"api_keys_file": "/empty"}},
            {"/empty": "# none\n"},
            {},
            ["coordinator.api_keys_file", "no key"],
        ),
        ({"nats": {"password_file": "/empty"}}, {"/empty": "\n"}, {}, ["nats.password_file", "empty"]),
        ({}, {}, {"MOTOR_COORDINATOR_API_KEYS": " , "}, ["MOTOR_COORDINATOR_API_KEYS", "no key"]),
    ],
)
def test_unusable_secrets_name_their_source(
    raw: dict[str, object], files: dict[str, str], env: dict[str, str], needles: list[str]
) -> None:
    cfg = config_from_dict({"union": {}, **raw})
    with pytest.raises(ConfigError) as info:
        resolve_secrets(cfg, env, _read(files))
    for n in needles:
        assert n in str(info.value)


@pytest.mark.parametrize(
    ("raw", "needles"),
    [
        ({"coordinator": {"api_keys": ["a b"]}}, ["coordinator.api_keys", "whitespace"]),
        ({"coordinator": {"admin_keys": [""]}}, ["coordinator.admin_keys", "empty"]),
        ({"coordinator": {"api_keys": ["k"], "api_keys_file": "/k"}}, ["api_keys_file", "not both"]),
        ({"nats": {"password": "p", "password_file": "/p"}}, ["password_file", "not both"]),
        ({"coordinator": {"http": {"max_header_fields": 0}}}, ["coordinator.http.max_header_fields"]),
    ],
)
def test_bad_secret_fields_name_the_field(raw: dict[str, object], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"union": {}, **raw})
    for n in needles:
        assert n in str(info.value)


def test_load_config_file_reads_env_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "admin.keys"
    keys.write_text("admin-from-file\n")
    keys.chmod(0o600)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"union": {}, "coordinator": {"admin_keys_file": str(keys)}}))
    monkeypatch.setenv("MOTOR_COORDINATOR_API_KEYS", "user-from-env")
    cfg = load_config_file(str(path))
    assert cfg.coordinator.api_keys == ["user-from-env"]
    assert cfg.coordinator.admin_keys == ["admin-from-file"]
