"""`motor up`'s supervisor on real processes: kill -9 brings a process back with backoff;
a held process is left to its holder; a deliberate stop restarts nothing; a killed
nats-server comes back on the same port and store; a process that stops answering its
liveness probe (SIGSTOP, or its event loop wedged) is killed and started again, one that is
held is not."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deploy.liveness import LivenessRule, probe_unix
from deploy.supervise import Backoff, Supervisor, Watch, wait_popen
from streams.connection import connect
from streams.server import EmbeddedNats

FAST = Backoff(initial=0.1, factor=2.0, maximum=0.4, stable_after=60.0)
PAUSE = [sys.executable, "-c", "import signal; signal.pause()"]


def pause_process() -> subprocess.Popen[bytes]:
    """A child that waits for a signal."""
    return subprocess.Popen(PAUSE)


class Sleeper:
    """One supervised child process that waits for a signal."""

    def __init__(self) -> None:
        self.proc = pause_process()
        self.spawned = 1

    def watch(self, name: str = "sleeper") -> Watch:
        async def respawn() -> None:
            self.proc = pause_process()
            self.spawned += 1

        return Watch(name, lambda: self.proc, lambda: wait_popen(self.proc), respawn)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)


@pytest.fixture
async def sleeper() -> AsyncIterator[Sleeper]:
    s = Sleeper()
    yield s
    if s.proc.poll() is None:
        s.kill()
        s.proc.wait()


async def until(pred: object, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not pred():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_killed_process_is_restarted_with_growing_backoff_and_said(sleeper: Sleeper) -> None:
    sup = Supervisor(FAST)
    sup.watch(sleeper.watch())
    try:
        for n in (1, 2, 3):
            pid = sleeper.proc.pid
            sleeper.kill()
            await until(lambda n=n: sup.restarts("sleeper") == n)  # type: ignore[misc]
            assert sleeper.proc.pid != pid and sleeper.proc.poll() is None
        restarted = [x for x in sup.notices if x.kind == "restarted"]
        assert [x.delay for x in restarted] == [0.1, 0.2, 0.4]
        assert restarted[-1].describe() == "restarted sleeper (exit -9) after 0.4 s, 3 restarts"
    finally:
        await sup.stop()


async def test_held_process_is_left_to_its_holder_then_followed(sleeper: Sleeper) -> None:
    sup = Supervisor(FAST)
    sup.watch(sleeper.watch())
    try:
        with sup.hold("sleeper"):
            sleeper.kill()
            await asyncio.to_thread(sleeper.proc.wait)
            await asyncio.sleep(0.5)  # several backoffs: nothing may happen while held
            assert sleeper.spawned == 1 and sup.restarts("sleeper") == 0
            sleeper.proc = pause_process()  # the holder brings it back itself
        pid = sleeper.proc.pid
        await asyncio.sleep(0.3)
        assert sup.restarts("sleeper") == 0 and sleeper.spawned == 1
        sleeper.kill()  # the supervisor follows the holder's process
        await until(lambda: sup.restarts("sleeper") == 1)
        assert sleeper.proc.pid != pid
    finally:
        await sup.stop()


async def test_deliberate_stop_and_unsupervised_restart_nothing(sleeper: Sleeper) -> None:
    sup = Supervisor(FAST)
    sup.watch(sleeper.watch())
    sup.set_supervised("sleeper", False)
    sleeper.kill()
    await asyncio.sleep(0.5)
    assert sleeper.spawned == 1 and sleeper.proc.poll() is not None
    other = Sleeper()
    sup.watch(other.watch("other"))
    await sup.stop()
    other.kill()
    await asyncio.sleep(0.5)
    assert other.spawned == 1


async def test_killed_nats_server_comes_back_on_the_same_port_and_store(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats", log_file=tmp_path / "nats.log")
    await server.start()
    sup = Supervisor(FAST)
    sup.watch(Watch("nats-server", lambda: server.pid, server.wait, server.start))
    try:
        nc = await connect(server.url, name="supervision-test")
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        await js.publish("keep.a", b"before")
        await nc.close()
        pid, port = server.pid, server.port
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await until(lambda: sup.restarts("nats-server") == 1, within=30)
        assert server.pid != pid and server.port == port
        nc = await connect(server.url, name="supervision-test")
        msg = await nc.jetstream().get_msg("KEEP", 1)
        assert msg.data == b"before"
        await nc.close()
    finally:
        await sup.stop()
        await server.stop()


# A process answering `GET /liveness` on a Unix socket, as a coordinator replica does.
ANSWERS = """
import asyncio, os, signal, sys, time

async def answer(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\nok")
    await writer.drain()
    writer.close()

async def main():
    # SIGUSR1 wedges it: the handler blocks the event loop, the process runs on, its socket
    # stays open and the kernel still completes connections to it.
    signal.signal(signal.SIGUSR1, lambda *_: time.sleep(3600))
    path = sys.argv[1]
    if os.path.exists(path):
        os.unlink(path)  # a killed predecessor's
    server = await asyncio.start_unix_server(answer, path)
    await server.serve_forever()

asyncio.run(main())
"""
QUICK = LivenessRule(interval=0.2, timeout=0.3, misses=3)


class Answerer:
    """One supervised child that answers liveness probes on its own socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = self.spawn()
        self.spawned = 1

    def spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", ANSWERS, str(self.path)])

    def watch(self) -> Watch:
        async def respawn() -> None:
            self.proc = self.spawn()
            self.spawned += 1

        async def probe() -> bool:
            return await probe_unix(str(self.path), QUICK.timeout)

        def kill() -> bool:
            if self.proc.poll() is not None:
                return False
            os.kill(self.proc.pid, signal.SIGKILL)
            return True

        return Watch(
            "answerer", lambda: self.proc, lambda: wait_popen(self.proc), respawn, probe=probe, kill=kill
        )


@pytest.fixture
async def answerer(tmp_path: Path) -> AsyncIterator[Answerer]:
    a = Answerer(tmp_path / "answerer.sock")
    await until(lambda: a.path.exists())
    yield a
    if a.proc.poll() is None:
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait()


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGUSR1], ids=["stopped", "wedged"])
async def test_unanswering_process_is_killed_after_its_misses_and_started_again(
    answerer: Answerer, how: signal.Signals
) -> None:
    sup = Supervisor(FAST, liveness=QUICK)
    sup.watch(answerer.watch())
    try:
        await asyncio.sleep(1.0)  # several probes answered: armed, and nothing killed
        assert answerer.spawned == 1 and not sup.notices
        frozen = answerer.proc
        os.kill(frozen.pid, how)
        t0 = asyncio.get_running_loop().time()
        await until(lambda: answerer.spawned == 2, within=5)
        took = asyncio.get_running_loop().time() - t0
        assert frozen.poll() == -signal.SIGKILL  # killed while stopped or blocked
        assert took <= QUICK.kill_within + FAST.initial + 0.5
        kinds = [n.kind for n in sup.notices]
        assert kinds == ["unresponsive", "exited", "restarted"]
        assert "3 probes in a row unanswered" in sup.notices[0].detail
        # The fresh process answers and is left alone.
        await until(lambda: answerer.path.exists())
        await asyncio.sleep(1.0)
        assert answerer.spawned == 2 and await probe_unix(str(answerer.path), 1.0)
    finally:
        await sup.stop()


async def test_held_process_may_freeze_without_being_killed(answerer: Answerer) -> None:
    sup = Supervisor(FAST, liveness=QUICK)
    sup.watch(answerer.watch())
    try:
        await asyncio.sleep(0.6)
        with sup.hold("answerer"):
            os.kill(answerer.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(QUICK.kill_within + 0.5)
            assert answerer.proc.poll() is None and not sup.notices
            os.kill(answerer.proc.pid, signal.SIGCONT)
        await asyncio.sleep(1.0)  # judged afresh once released: it answers again
        assert answerer.spawned == 1 and not sup.notices
    finally:
        await sup.stop()
