"""Each injected fault of the builtin engine, by flag and by `POST /admin/faults`."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from simengine.injection import CRASH_EXIT_CODE, MID_STREAM_EXIT_CODE
from tests.integration.builtin_proc import BuiltinEngineProc, http

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinEngineProc]:
    with BuiltinEngineProc(tmp_path_factory.mktemp("faults"), "--fast", name="faults") as e:
        yield e


@pytest.fixture
def clean(eng: BuiltinEngineProc) -> Iterator[BuiltinEngineProc]:
    yield eng
    status, _, _ = http("POST", eng.url + "/admin/faults", {"reset": True})
    assert status == 200


def chat(eng: BuiltinEngineProc, **extra: object) -> tuple[int, bytes]:
    status, _, raw = http("POST", eng.url + "/v1/chat/completions", {**BODY, **extra})
    return status, raw


def set_faults(eng: BuiltinEngineProc, **patch: object) -> dict[str, object]:
    status, _, raw = http("POST", eng.url + "/admin/faults", patch)
    assert status == 200, raw
    answer: dict[str, object] = orjson.loads(raw)
    return answer


def test_crash_after_n_requests(tmp_path: Path) -> None:
    e = BuiltinEngineProc(tmp_path, "--fast", "--crash-after", "3", name="crash").start()
    try:
        for _ in range(3):
            assert chat(e)[0] == 200  # each of the N requests is fully answered
        assert e.wait_exit(30) == CRASH_EXIT_CODE
        with pytest.raises(OSError):
            http("GET", e.url + "/health", timeout=2)
    finally:
        e.stop()


def test_crash_after_set_at_runtime(tmp_path: Path) -> None:
    with BuiltinEngineProc(tmp_path, "--fast", name="crash-admin") as e:
        assert chat(e)[0] == 200
        set_faults(e, crash_after=1)
        assert chat(e)[0] == 200
        assert e.wait_exit(30) == CRASH_EXIT_CODE


def test_die_mid_stream(tmp_path: Path) -> None:
    with BuiltinEngineProc(tmp_path, "--itl-ms", "5", "--die-mid-stream", "4", name="midstream") as e:
        assert chat(e)[0] == 200  # non-streamed requests are not affected
        with socket.create_connection(("127.0.0.1", e.port), timeout=20) as s:
            body = orjson.dumps({**BODY, "max_tokens": 50, "stream": True})
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        assert data.count(b'"content":') == 5  # the role chunk and four tokens, then nothing
        assert b"[DONE]" not in data and not data.endswith(b"0\r\n\r\n")
        assert e.wait_exit(30) == MID_STREAM_EXIT_CODE


def test_hang_health(clean: BuiltinEngineProc) -> None:
    set_faults(clean, hang_health=True)
    with pytest.raises(TimeoutError):
        http("GET", clean.url + "/health", timeout=1.0)
    assert http("GET", clean.url + "/v1/models")[0] == 200  # the rest still answers
    set_faults(clean, hang_health=False)
    assert http("GET", clean.url + "/health")[0] == 200


def test_error_rate(clean: BuiltinEngineProc) -> None:
    set_faults(clean, error_rate=1.0)
    status, raw = chat(clean)
    err = orjson.loads(raw)["error"]
    assert status == 500 and err["code"] == 500 and "injected" in err["message"]
    set_faults(clean, error_rate=0.5)
    statuses = [chat(clean)[0] for _ in range(60)]
    assert statuses.count(500) > 10 and statuses.count(200) > 10


def test_slow_tokens(clean: BuiltinEngineProc) -> None:
    t0 = time.monotonic()
    assert chat(clean, max_tokens=11)[0] == 200
    fast = time.monotonic() - t0
    set_faults(clean, slow_tokens_ms=50)
    t0 = time.monotonic()
    assert chat(clean, max_tokens=11)[0] == 200
    assert time.monotonic() - t0 >= 0.5 > fast


@pytest.mark.parametrize("status", ["unhealthy", "dead"])
def test_fault_tolerance_status(clean: BuiltinEngineProc, status: str) -> None:
    set_faults(clean, ft_status=status)
    code, _, raw = http("GET", clean.url + "/fault_tolerance/status")
    answer = orjson.loads(raw)
    assert code == 200 and answer["status"] == status and answer["reason"]
    health = http("GET", clean.url + "/health")[0]
    assert health == (503 if status == "dead" else 200)


def test_ft_status_flag(tmp_path: Path) -> None:
    with BuiltinEngineProc(tmp_path, "--fast", "--ft-status", "unhealthy", name="ft") as e:
        _, _, raw = http("GET", e.url + "/fault_tolerance/status")
        assert orjson.loads(raw)["status"] == "unhealthy"


def test_precision_fault(clean: BuiltinEngineProc) -> None:
    good = orjson.loads(chat(clean)[1])["choices"][0]["message"]["content"]
    set_faults(clean, precision=True)
    bad = orjson.loads(chat(clean)[1])["choices"][0]["message"]["content"]
    assert bad != good and ("NaN" in bad or "nan" in bad or "inf" in bad)


def test_admin_faults_validation_and_listing(clean: BuiltinEngineProc) -> None:
    status, _, raw = http("POST", clean.url + "/admin/faults", {"error_rate": 3})
    assert status == 400 and "error_rate" in orjson.loads(raw)["error"]["message"]
    status, _, raw = http("POST", clean.url + "/admin/faults", {"bogus": 1})
    assert status == 400 and "bogus" in orjson.loads(raw)["error"]["message"]
    status, _, raw = http("GET", clean.url + "/admin/faults")
    assert status == 200 and orjson.loads(raw)["error_rate"] == 0.0
