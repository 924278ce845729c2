"""The embedded NATS of `motor up`: one nats-server, or a JetStream cluster of N.

`motor up --nats-cluster 3` runs three servers with routes between them, JetStream on each
(`sync_interval: always`, the store of each under `<root>/nats/nN/`), named `n1` … `n3` (the
JetStream peer names the live view shows as the MOTOR stream's leader). Member i listens on
the base ports + i (4222-4224 clients, 8222-8224 monitoring, 6222-6224 routes by default), on
its host's address: one machine for `motor up`, one network namespace each in
tests/multihost. Routes log in with their own user (`route`), whose password `motor up` keeps
with the other credentials; clients get every member's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.hosts import LOCAL, Host
from deploy.natshealth import watch
from deploy.supervise import Notice, Watch
from streams.errors import NatsServerFailed
from streams.server import EmbeddedNats, cluster_conf, route_url

CLUSTER_NAME = "motor"
ROUTE_USER = "route"
SINGLE = "nats-server"  # the supervised name of a lone server (and its log's name)


@dataclass(frozen=True, slots=True)
class NatsMember:
    """One server of the cluster: its peer name, host and ports."""

    name: str
    host: Host
    port: int
    monitor_port: int
    route_port: int

    @property
    def url(self) -> str:
        """The URL clients dial."""
        return f"nats://{self.host.ip}:{self.port}"

    @property
    def process(self) -> str:
        """The supervised name of this server (`nats-n1`)."""
        return f"nats-{self.name}"


def plan_members(
    size: int, hosts: Sequence[Host], *, port: int, monitor_port: int, route_port: int
) -> list[NatsMember]:
    """`size` members, member i on `hosts[i % len(hosts)]` at the base ports + i."""
    if size < 1:
        raise ValueError(f"nats cluster size: at least 1, got {size}")
    pool = list(hosts) or [LOCAL]
    return [
        NatsMember(f"n{i + 1}", pool[i % len(pool)], port + i, monitor_port + i, route_port + i)
        for i in range(size)
    ]


class NatsCluster:
    """The servers of one cluster (a single server is a cluster of one, with no routes)."""

    def __init__(
        self,
        root: Path,
        members: Sequence[NatsMember],
        logs: Path,
        *,
        extra_conf: str = "",
        route_password: str | None = None,
        max_file_store: int | None = None,
    ) -> None:
        self.members = list(members)
        self.servers: dict[str, EmbeddedNats] = {}
        clustered = len(self.members) > 1
        for m in self.members:
            conf = extra_conf
            if clustered:
                routes = [
                    route_url(p.host.ip, p.route_port, ROUTE_USER, route_password) for p in self.members
                ]
                block = cluster_conf(
                    CLUSTER_NAME,
                    f"{m.host.ip}:{m.route_port}",
                    routes,
                    user=ROUTE_USER if route_password is not None else None,
                    password=route_password,
                )
                conf = f"{extra_conf}\n{block}"
            self.servers[m.name] = EmbeddedNats(
                root / "nats" / m.name if clustered else root / "nats",
                host=m.host.ip,
                port=m.port,
                monitor_port=m.monitor_port,
                log_file=logs / (f"{m.process}.log" if clustered else f"{SINGLE}.log"),
                extra_conf=conf,
                server_name=m.name if clustered else None,
                argv_prefix=m.host.prefix(),
                max_file_store=max_file_store,
            )

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def urls(self) -> list[str]:
        """Every member's client URL."""
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        """Every member's client URL, comma-separated (what `--nats-url` takes)."""
        return ",".join(self.urls)

    def process_name(self, member: NatsMember) -> str:
        """The supervised name of a member: `nats-server` alone, `nats-n1` … in a cluster."""
        return member.process if self.size > 1 else SINGLE

    def watches(self, notify: Callable[[Notice], None] | None = None) -> list[Watch]:
        """The supervisor's watch of each member (`deploy.natshealth.watch`)."""
        return [watch(self.servers[m.name], self.process_name(m), notify) for m in self.members]

    def member(self, name: str) -> NatsMember:
        """The member called `name` (`n2`), or the one whose process is called so (`nats-n2`)."""
        for m in self.members:
            if name in (m.name, self.process_name(m)):
                return m
        raise KeyError(name)

    def server(self, name: str) -> EmbeddedNats:
        """The server of member `name` (`n1`, or its process name)."""
        return self.servers[self.member(name).name]

    async def start(self, within: float = 30.0) -> None:
        """Start every member at once and wait until JetStream has a meta leader they follow."""
        try:
            await asyncio.gather(*(s.start() for s in self.servers.values()))
            if self.size > 1:
                await asyncio.gather(*(s.wait_current(within) for s in self.servers.values()))
        except TimeoutError:
            await self.stop()
            raise NatsServerFailed(
                f"the {self.size} nats-servers started but formed no JetStream cluster within "
                f"{within:g}s: see their logs ({', '.join(self.process_name(m) for m in self.members)})"
            ) from None
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every member."""
        for s in self.servers.values():
            with contextlib.suppress(Exception):
                await s.stop()
