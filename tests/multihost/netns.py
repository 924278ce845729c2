"""Hosts on one machine: network namespaces joined by veth pairs to one bridge.

Each host is a namespace `mh-<run>-hN` with `eth0` (198.18.0.1N/24, the range RFC 2544
reserves for network tests) whose peer `mh<run>vN` sits on the bridge `mh<run>br`
(198.18.0.1/24, the root namespace's address, from which the client drives traffic). Cutting
a host sets its bridge-side veth down: every packet to and from it is dropped, as when a
switch port dies, and its processes keep running. Killing a host SIGKILLs every process in its
namespace. `teardown` removes every namespace and link, and `sweep` removes what a crashed
earlier run left (names under `mh-`), so a failed test never leaves the machine changed.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field

from deploy.hosts import Host

_OURS = re.compile(r"mh[0-9a-f]{4}(br|v\d+)")  # Network's bridge and veth names
SUBNET = "198.18.0"  # 198.18.0.0/15: benchmarking networks (RFC 2544), never a private range
PREFIX = "mh"


class NetnsError(RuntimeError):
    """The network could not be built or changed (names the `ip` command that failed)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; raise `NetnsError` naming the command when it fails and `check`."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def netns_pids(netns: str) -> list[int]:
    """Every process in the namespace."""
    out = ip("netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_all(netns: str, *, within: float = 10.0) -> int:
    """SIGKILL every process in the namespace until none is left; how many were killed."""
    killed = 0
    deadline = time.monotonic() + within
    while pids := netns_pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} in {netns} outlived SIGKILL for {within:g}s")
        time.sleep(0.05)
    return killed


@dataclass
class Network:
    """A bridge and `n` hosts on it, made by `build` and removed by `teardown`."""

    n: int = 3
    run: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: list[Host] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (where the client's packets come from)."""
        return f"{SUBNET}.1"

    def veth(self, host: Host) -> str:
        """The bridge side of a host's link (what a cut sets down)."""
        return f"{PREFIX}{self.run}v{host.name[1:]}"

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def build(self) -> list[Host]:
        """Make the bridge and the hosts; every host reaches every other and the root."""
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i in range(1, self.n + 1):
                h = Host(f"h{i}", f"{SUBNET}.{10 + i}", f"{PREFIX}-{self.run}-h{i}")
                assert h.netns is not None
                ip("netns", "add", h.netns)
                self.hosts.append(h)
                ip("link", "add", self.veth(h), "type", "veth", "peer", "name", "eth0", "netns", h.netns)
                ip("link", "set", self.veth(h), "master", self.bridge, "up")
                ip("-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
                ip("-n", h.netns, "link", "set", "eth0", "up")
                ip("-n", h.netns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return list(self.hosts)

    def cut(self, host: Host) -> float:
        """Take the host off the network (its processes run on); when it happened."""
        ip("link", "set", self.veth(host), "down")
        return time.time()

    def heal(self, host: Host) -> float:
        """Put the host back on the network; when it happened."""
        ip("link", "set", self.veth(host), "up")
        return time.time()

    def kill(self, host: Host) -> float:
        """SIGKILL every process of the host (a power cut); when it happened."""
        assert host.netns is not None
        at = time.time()
        kill_all(host.netns)
        return at

    def teardown(self) -> None:
        """Kill every process of every host and remove the namespaces, links and bridge."""
        for h in self.hosts:
            assert h.netns is not None
            with contextlib.suppress(NetnsError):
                kill_all(h.netns)
            ip("link", "del", self.veth(h), check=False)
            ip("netns", "del", h.netns, check=False)
        ip("link", "del", self.bridge, check=False)
        self.hosts = []


def sweep() -> list[str]:
    """Remove namespaces and links an earlier run left behind; their names."""
    removed = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"{PREFIX}-"):
            with contextlib.suppress(NetnsError):
                kill_all(name)
            ip("netns", "del", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(": ")
        if len(parts) < 2:
            continue
        link = parts[1].split("@")[0]
        if _OURS.fullmatch(link):
            ip("link", "del", link, check=False)
            removed.append(link)
    return removed
