"""Whole-cluster scenarios on a `motor up`-style cluster (module-scoped, run in order).

nats-server, a controller leader and a standby, a coordinator and four node agents with
builtin engines (one union instance, a 1P1D pair, one spare node), all real processes.
Clients are the official `openai` SDK; operators act through the `motor` CLI.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from core.events import InstanceState, Role
from tests.localcluster import Harness, engine_pid

PROMPT = [{"role": "user", "content": "Tell me about the event log of a control plane"}]


async def motor(h: Harness, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the `motor` CLI against the cluster, as an operator would (off the event loop)."""
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "deploy.cli",
            *args,
            "--nats-url",
            h.cluster.url,
            "--root",
            str(h.cluster.root),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert proc.returncode == 0, f"motor {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


async def prompt_tokens(port: int) -> float:
    """The engine's prompt token counter: it moves only when the engine served a request."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    return _prompt_total(text)


async def served_tokens(port: int) -> tuple[int | None, float]:
    """(pid, prompt tokens) of the engine on `port`, or (None, 0) while it is down."""
    try:
        pid = engine_pid(port)
        return pid, await prompt_tokens(port)
    except (AssertionError, aiohttp.ClientError):
        return None, 0.0


def _prompt_total(text: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def chat(h: Harness, **kw: Any) -> str:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="none", max_retries=0, timeout=60)
    try:
        resp = await client.chat.completions.create(
            model="motor-sim", messages=PROMPT, max_tokens=24, temperature=0, **kw
        )
        return resp.choices[0].message.content or ""
    finally:
        await client.close()


async def direct_union(h: Harness) -> str:
    """The same request straight to the union engine, bypassing the coordinator."""
    port = h.engine_port(h.instance_of(Role.UNION))
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    try:
        resp = await client.chat.completions.create(
            model="motor-sim", messages=PROMPT, max_tokens=24, temperature=0
        )
        return resp.choices[0].message.content or ""
    finally:
        await client.close()


async def wait_ready(h: Harness) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(h.cluster.coordinator_url + "/readiness") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert asyncio.get_running_loop().time() < deadline, "coordinator never became ready"
            await asyncio.sleep(0.2)


async def test_openai_sdk_through_coordinator_pd_equals_union(harness: Harness) -> None:
    h = harness
    await wait_ready(h)
    p_port = h.engine_port(h.instance_of(Role.PREFILL))
    before = await prompt_tokens(p_port)
    text = await chat(h)
    assert text
    assert await prompt_tokens(p_port) > before, "the request did not take the P/D path"
    assert text == await direct_union(h)
    # Streamed, the same text arrives in pieces.
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="none", max_retries=0)
    stream = await client.chat.completions.create(
        model="motor-sim", messages=PROMPT, max_tokens=24, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    await client.close()
    assert len(pieces) > 1 and "".join(pieces) == text
    models = await openai.AsyncOpenAI(base_url=h.base_url, api_key="none").models.list()
    assert [m.id for m in models.data] == ["motor-sim"]


async def test_an_engine_inherits_none_of_its_agents_credentials(harness: Harness) -> None:
    """Regression (issue 24): an engine inherited its agent's whole environment, the path to the
    agent's NATS login (`MOTOR_NATS_CONTEXT`) included."""
    h = harness
    await wait_ready(h)
    iid = h.instance_of(Role.UNION)
    node = h.state.instances[iid].spec.members[0].node_id
    agent = h.cluster.child(f"nodeagent-{node}").proc
    assert agent is not None
    agent_env = _environ(agent.pid)
    assert "MOTOR_NATS_CONTEXT" in agent_env  # what the agent logs in with
    engine_env = _environ(engine_pid(h.engine_port(iid)))
    assert not [k for k in engine_env if k.startswith("MOTOR_") and k != "MOTOR_UP_SESSION"], engine_env
    assert engine_env.get("MOTOR_UP_SESSION") == agent_env.get("MOTOR_UP_SESSION")  # motor up finds it


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


async def test_kill_engine_requests_keep_succeeding_and_instance_recovers(harness: Harness) -> None:
    h = harness
    d_id = h.instance_of(Role.DECODE)
    pid = engine_pid(h.engine_port(d_id))
    os.kill(pid, signal.SIGKILL)
    # While the decode engine is down and being restarted, every request still succeeds.
    answers = [await chat(h) for _ in range(8)]
    assert all(answers)
    await h.wait_for(f"decode instance {d_id} back to ACTIVE", lambda s: h.active(d_id), within=60)
    assert engine_pid(h.engine_port(d_id)) != pid
    p_port = h.engine_port(h.instance_of(Role.PREFILL))
    before = await prompt_tokens(p_port)
    await wait_ready(h)

    async def pd_again() -> bool:
        await chat(h)
        return await prompt_tokens(p_port) > before

    for _ in range(50):
        if await pd_again():
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("requests never returned to the P/D path after recovery")


async def test_precision_alarm_isolates_group_then_clears(harness: Harness) -> None:
    h = harness
    d_id, p_id = h.instance_of(Role.DECODE), h.instance_of(Role.PREFILL)
    raised = await motor(
        h, "precision", "raise", "--d-instance", str(d_id), "--p-instance", str(p_id), "--reason", "e2e drill"
    )
    await h.wait_for(
        f"the alarm in the log ({raised.stdout.strip()})",
        lambda s: h.seen("precision.alarm_raised", d_instance_id=d_id),
        within=30,
    )
    # Once the controller has answered it, every replica that follows the log has the alarm.
    await h.wait_for(
        "the group isolated",
        lambda s: h.seen("instance.state_changed", instance_id=d_id, state=InstanceState.ISOLATED),
        within=30,
    )
    # The group is excluded (and restarted): requests are served by the union instance; the
    # prefill engine serves none of them, whether it is the same process or a restarted one.
    p_port = h.engine_port(p_id)
    u_port = h.engine_port(h.instance_of(Role.UNION))
    pid_before, before = await served_tokens(p_port)
    union_before = await prompt_tokens(u_port)
    for _ in range(4):
        assert await chat(h)
    assert await prompt_tokens(u_port) > union_before, "the union instance did not take over"
    pid_after, after = await served_tokens(p_port)
    if pid_after is not None and pid_after == pid_before:
        assert after == before, "a request reached the alarmed P/D group"
    elif pid_after is not None:
        assert d_id not in h.state.alarms or after == 0, "a request reached the alarmed P/D group"
    # The controller isolates the group, recovers it and clears the alarm itself.
    await h.wait_for(
        "alarm cleared by the controller and the group ACTIVE again",
        lambda s: (
            h.seen("precision.alarm_cleared", d_instance_id=d_id)
            and h.seen("instance.state_changed", instance_id=d_id, state=InstanceState.ISOLATED)
            and d_id not in s.alarms
            and h.active(d_id)
            and h.active(p_id)
        ),
        within=90,
    )


async def test_hardware_fault_replaces_node_and_explain_names_it(harness: Harness, tmp_path: Path) -> None:
    h = harness
    u_id = h.instance_of(Role.UNION)
    node = h.state.instances[u_id].spec.members[0].node_id
    out = await motor(h, "fault", "report", "--node", node, "--level", "L5", "--code", "CardUnhealthy")
    assert re.search(r"fault f-\w+ reported", out.stdout)
    # L5: the instance leaves routing; the node is replaced by the spare.
    await h.wait_for(
        "a union instance ACTIVE on another node",
        lambda s: any(
            i.spec.role == Role.UNION and i.state == InstanceState.ACTIVE and node not in i.node_ids
            for i in s.instances.values()
        ),
        within=90,
    )
    assert all(await asyncio.gather(*(chat(h) for _ in range(3))))
    explained = (await motor(h, "replay", "--explain", "node", node)).stdout
    assert "fault.reported L5 CardUnhealthy on " + node in explained
    explained_inst = (await motor(h, "replay", "--explain", "instance", str(u_id))).stdout
    assert "CardUnhealthy" in explained_inst, explained_inst
    await motor(h, "fault", "clear", "--node", node)
    await h.wait_for("fault cleared", lambda s: not s.node_faults(node), within=30)


async def test_replay_reproduces_live_controller_state(harness: Harness, tmp_path: Path) -> None:
    h = harness
    async with aiohttp.ClientSession() as s, s.get(h.cluster.controller_url + "/debug/state") as r:
        assert r.status == 200, await r.text()
        live = await r.json()
    seq = live["last_seq"]
    export = tmp_path / "incident.jsonl"
    await motor(h, "events", "export", str(export))
    replayed = (
        await motor(h, "replay", "--from-file", str(export), "--until-seq", str(seq), "--json")
    ).stdout
    import orjson

    state = orjson.loads(replayed[replayed.index("{") :])
    # Heartbeat-derived fields are not in the MOTOR log; everything else must match exactly.
    for snap in (live, state):
        snap.pop("events_applied")
        snap.pop("last_ts")
        for n in snap["nodes"].values():
            for key in ("last_hb_ts", "load", "last_hb_id"):
                n.pop(key)
    assert state == live
    verify = await motor(
        h, "replay", "--from-file", str(export), "--verify", "--config", str(h.cluster.root / "cluster.json")
    )
    assert " 0 differ" in verify.stdout, verify.stdout


async def test_timeline_renders_in_headless_chromium(harness: Harness, tmp_path: Path) -> None:
    h = harness
    page = tmp_path / "incident.html"
    await motor(h, "replay", "--timeline", str(page))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (apt-get install chromium; `just test` installs it)"
    dom = (
        await asyncio.to_thread(
            subprocess.run,
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / 'chrome'}",
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    ).stdout
    lanes = re.findall(r'data-lane="([^"]+)"', dom)
    assert any(lane.startswith("instance-") for lane in lanes), dom[:2000]
    assert any(lane.startswith("endpoint-") for lane in lanes)
    assert "marks-fault" in lanes and "marks-command" in lanes and "marks-leader" in lanes
    assert "mark-fault" in dom and "state-ACTIVE" in dom


async def test_nats_refuses_anonymous_clients_and_the_cli_finds_motor_ups_credentials(
    harness: Harness,
) -> None:
    h = harness
    from streams.connection import connect
    from streams.errors import NatsUnavailable

    with pytest.raises(NatsUnavailable, match=r"(?i)authorization"):
        await connect(h.cluster.url, name="anonymous")
    # No password on any child's command line (`ps` shows it): they read a 0600 file.
    assert h.cluster.auth is not None
    passwords = [pw.encode() for _, pw in h.cluster.auth.users]
    for child in h.cluster.children:
        assert child.proc is not None
        argv = _cmdline(child.proc.pid)
        assert not any(pw in argv for pw in passwords), child.name
    assert _modes(h.cluster.root / "auth") == {0o600}

    # Without --nats-url: the URL and the inspect user come from the files under --root.
    cli = [sys.executable, "-m", "deploy.cli"]
    ls = await asyncio.to_thread(
        subprocess.run,
        [*cli, "events", "ls", "--root", str(h.cluster.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ls.returncode == 0 and "MOTOR" in ls.stdout, ls.stderr
    st = await asyncio.to_thread(
        subprocess.run,
        [*cli, "status", "--root", str(h.cluster.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert st.returncode == 0, st.stderr
    # Elsewhere, without credentials: a clear message, no traceback.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOTOR_NATS")}
    lost = await asyncio.to_thread(
        subprocess.run,
        [*cli, "events", "ls", "--nats-url", h.cluster.url, "--root", str(h.cluster.root / "nowhere")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert lost.returncode == 1 and "refused the login" in lost.stderr and "MOTOR_NATS_CONTEXT" in lost.stderr
    assert "Traceback" not in lost.stderr
    # The inspect user reads; it does not write (a fault report needs the operator user).
    denied = await asyncio.to_thread(
        subprocess.run,
        [*cli, "fault", "report", "--node", "union-0", "--code", "X", "--level", "L2",
         "--nats-context", str(h.cluster.root / "auth" / "inspect.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert denied.returncode == 1 and "permissions violation" in denied.stderr.lower(), denied.stderr


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _modes(d: Path) -> set[int]:
    return {f.stat().st_mode & 0o777 for f in d.iterdir()}
