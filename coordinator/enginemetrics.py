"""Every engine's `/metrics`, collected by the coordinator and served relabelled, plus the list of
engine targets for Prometheus' HTTP service discovery.

Seed 002's coordinator metrics module polls each engine's `/metrics` in the background and
re-exports it. The coordinator, not the node agent, does it here: its routing table already
knows every engine (managed ones and those registered with `/v1/instances/refresh`) with
its instance, role and node, so one scrape target carries the whole fleet, and a node agent
knows only its own engines. Every `coordinator.engine_metrics_interval` s (MindIE's
`reuse_time`, 3 s) each known endpoint is scraped; its samples get the labels `instance_id`,
`role`, `node` and `endpoint` (an engine's own label of the same name is replaced) and are
served, one HELP/TYPE per family, on `GET /metrics/engines` (also `/instance/metrics`, the
MindIE path). `GET /prometheus/targets` answers Prometheus' `http_sd_configs` with every
engine's address and the same labels, for scraping the engines directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from coordinator.context import CoordinatorContext
from coordinator.metrics import CoordinatorMetrics

log = logging.getLogger(__name__)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S.*)$")
_HEADER = re.compile(r"^#\s+(HELP|TYPE)\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\b")


def parse_labels(text: str) -> list[tuple[str, str]]:
    """`a="x",b="y\\"z"` -> [(a, x), (b, y\\"z)] (values kept escaped, as written)."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        if i >= n:
            break
        eq = text.index("=", i)
        name = text[i:eq].strip()
        j = text.index('"', eq) + 1
        value = []
        while text[j] != '"':
            if text[j] == "\\":
                value.append(text[j : j + 2])
                j += 2
            else:
                value.append(text[j])
                j += 1
        out.append((name, "".join(value)))
        i = j + 1
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def relabel(text: str, labels: dict[str, str]) -> list[tuple[str, list[str]]]:
    """An exposition split into families: (family name, its header and sample lines relabelled)."""
    ours = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    families: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    name = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        head = _HEADER.match(line)
        if head is not None:
            if head.group(2) != name or current is None:
                name, current = head.group(2), []
                families.append((name, current))
            current.append(line)
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        metric, raw, value = m.groups()
        try:
            theirs = [(k, v) for k, v in parse_labels(raw or "") if k not in labels]
        except (ValueError, IndexError):
            continue  # a sample we cannot read is dropped, not passed on garbled
        rest = ",".join(f'{k}="{v}"' for k, v in theirs)
        if current is None or not metric.startswith(name):
            name, current = metric, []
            families.append((name, current))
        current.append(f"{metric}{{{ours}{',' if rest else ''}{rest}}} {value}")
    return families


def merge(expositions: list[list[tuple[str, list[str]]]]) -> str:
    """Many relabelled expositions as one: each family's header once, then every sample."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for families in expositions:
        for name, lines in families:
            if name not in heads:
                order.append(name)
                heads[name] = [ln for ln in lines if ln.startswith("#")]
                samples[name] = []
            samples[name].extend(ln for ln in lines if not ln.startswith("#"))
    out = []
    for name in order:
        out.extend(heads[name])
        out.extend(samples[name])
    return "\n".join(out) + ("\n" if out else "")


def node_of(key: str) -> str:
    """The node of an endpoint key: `<node>/<endpoint>`; engines registered by refresh are `ext/...`."""
    return "external" if key.startswith("ext/") else key.rsplit("/", 1)[0]


def target_labels(row: dict[str, Any]) -> dict[str, str]:
    """Our labels for one endpoint row of the routing table."""
    return {
        "instance_id": str(row["instance_id"]),
        "role": str(row["role"]),
        "node": node_of(str(row["key"])),
        "endpoint": str(row["key"]),
    }


def sd_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus HTTP SD: one target group per engine endpoint, with its labels."""
    return [
        {
            "targets": [f"{row['host']}:{row['port']}"],
            "labels": {
                **target_labels(row),
                "engine_type": str(row["engine_type"]),
                "model": str(row["model"]),
                "__metrics_path__": "/metrics",
            },
        }
        for row in rows
    ]


def unscrapable(host: str) -> str | None:
    """Why the coordinator will not fetch `/metrics` from this engine address, or None.

    An address comes from a registration, which anyone with a node's credentials may write,
    and `/metrics/engines` hands back what was fetched: a link-local address (169.254.169.254 is
    a cloud's instance metadata, credentials included), multicast, broadcast or an unspecified
    one is no engine, nor is a host name, which could resolve to any of these.
    """
    if host == "localhost":
        return None
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"{host!r} is not an IP address (engines register theirs)"
    reserved = addr.is_reserved and addr.version == 4  # 240/4 (IPv6's "reserved" holds ::1)
    if addr.is_link_local or addr.is_multicast or addr.is_unspecified or reserved:
        return f"{host} is a link-local, multicast, reserved or unspecified address, not an engine's"
    if isinstance(addr, ipaddress.IPv4Address) and addr == ipaddress.IPv4Address("255.255.255.255"):
        return f"{host} is the broadcast address"
    return None


@dataclass
class EngineScraper:
    """Scrapes every known engine on an interval and keeps its relabelled exposition."""

    rows: Callable[[], list[dict[str, Any]]]  # the routing table's endpoints (`describe`)
    interval: float
    metrics: CoordinatorMetrics | None = None
    latest: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _session: aiohttp.ClientSession | None = None
    _refused: set[str] = field(default_factory=set)  # endpoints whose address is not fetched

    async def start(self) -> None:
        """Begin scraping in the background."""
        self._session = aiohttp.ClientSession()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine-metrics")

    async def stop(self) -> None:
        """Stop scraping and close the HTTP session."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.interval)

    async def scrape_once(self) -> None:
        """Scrape every endpoint the table knows now; forget the ones it no longer knows."""
        rows = self.rows()
        keys = {str(r["key"]) for r in rows}
        for gone in set(self.latest) - keys:
            del self.latest[gone]
        await asyncio.gather(*(self._one(r) for r in rows))

    async def _one(self, row: dict[str, Any]) -> None:
        assert self._session is not None
        key = str(row["key"])
        why = unscrapable(str(row["host"]))
        if why is not None:
            if self.latest.pop(key, None) is not None or key not in self._refused:
                log.warning("engine metrics of %s not fetched: %s", key, why)
            self._refused.add(key)
            self._count(key, "refused")
            return
        url = f"http://{row['host']}:{row['port']}/metrics"
        try:
            timeout = aiohttp.ClientTimeout(total=min(self.interval, 5.0))
            async with self._session.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                text = await resp.text(errors="replace")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # A silent engine: its last numbers would lie, so they go (the scrape error says why).
            if self.latest.pop(key, None) is not None:
                log.info("engine metrics of %s unavailable: %s", key, exc)
            self._count(key, "error")
            return
        self.latest[key] = relabel(text, target_labels(row))
        self._count(key, "ok")

    def _count(self, key: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.engine_scrapes.labels(endpoint=key, result=result).inc()

    def render(self) -> bytes:
        """Every engine's latest exposition, merged."""
        return merge([self.latest[k] for k in sorted(self.latest)]).encode()


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def install_engine_metrics(app: FastAPI, ctx: CoordinatorContext) -> EngineScraper:
    """Add the engine-metrics and SD routes to the management app; scrape while it runs."""
    scraper = EngineScraper(ctx.table.describe, ctx.settings.engine_metrics_interval, ctx.metrics)

    async def engines() -> Response:
        """Every engine's /metrics, relabelled with instance_id, role, node and endpoint."""
        return Response(scraper.render(), media_type=PROMETHEUS_TEXT)

    async def targets() -> Response:
        """Prometheus HTTP service discovery: every engine's metrics address and labels."""
        return Response(orjson.dumps(sd_targets(ctx.table.describe())), media_type="application/json")

    # response_model=None: these answer Prometheus text and SD JSON of their own, nothing
    # for `/openapi.json` to describe as a model.
    app.add_api_route("/metrics/engines", engines, methods=["GET"], response_model=None)
    app.add_api_route("/instance/metrics", engines, methods=["GET"], response_model=None)
    app.add_api_route("/prometheus/targets", targets, methods=["GET"], response_model=None)
    app.router.on_startup.append(scraper.start)
    app.router.on_shutdown.append(scraper.stop)
    return scraper
