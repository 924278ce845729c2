"""Where a process of the local cluster runs: this machine, or a host in a network namespace.

`motor up` runs everything on `LOCAL` (127.0.0.1, bind addresses from the config). The
multi-host tests (tests/multihost) build hosts with `ip netns` + veth on a bridge and hand
the launcher one `Host` each: a process placed there runs under `ip netns exec <netns>`,
binds and registers on the host's address, and dies with the host when it is cut or killed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Host:
    """One machine of the cluster: its name, the address its processes use, its namespace."""

    name: str
    ip: str = "127.0.0.1"
    netns: str | None = None  # None: this machine's own network

    def prefix(self) -> list[str]:
        """The argv prefix that runs a command on this host."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def bind(self, configured: str) -> str:
        """The address a server on this host listens on (`configured`: the config's choice)."""
        return configured if self.netns is None else self.ip


LOCAL = Host("local")
