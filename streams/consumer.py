"""An ephemeral push consumer read in order, with the traps of issue 2 handled.

- Gaps are checked by *consumer* sequence (stream sequences have holes where messages were
  deleted); a gap, missed idle heartbeats or a deleted consumer recreate the consumer from
  the last stream sequence handed out, so the reader never skips and never repeats.
- Flow-control requests are answered when the reader reaches them in order, or delivery
  stalls; a stalled heartbeat's `Nats-Consumer-Stalled` subject is answered too.
- Nothing drops messages on a big replay: flow control bounds the backlog, not nats-py's
  default subscription limit.

Delivery goes through a `streams.sinks` sink: a receive-only protocol connection when it can,
else a nats-py subscription. Messages come out in batches of `Delivery` tuples; decoding is
the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from core.ids import new_id
from streams.cancelling import honour_swallowed_cancel
from streams.errors import StreamsError
from streams.log import API_TIMEOUT, Delivery, StreamMissing, StreamReplaced
from streams.rawsub import Frame
from streams.sinks import Sink, open_sink

log = logging.getLogger(__name__)

STREAM_NOT_FOUND = 10059
# Longest wait between two tries to recreate a consumer: bounds how long delivery stays off
# after NATS comes back.
MAX_RETRY_DELAY = 2.0


async def js_api(
    nc: Client, subject: str, body: dict[str, Any] | None = None, *, wait: float = API_TIMEOUT
) -> dict[str, Any]:
    """Call the JetStream API and return the response, raising StreamsError on an API error.

    `wait`: how long to wait for the answer. In a cluster a stream without a leader (one is
    being elected after its server died) answers nothing, and a request sent before the new
    leader exists is never answered: a caller in a hurry asks again with a short `wait`.
    """
    try:
        msg = await nc.request(subject, orjson.dumps(body) if body is not None else b"", timeout=wait)
    except NoRespondersError:
        raise StreamsError(f"{subject}: JetStream is not enabled on this server") from None
    except (NatsTimeoutError, TimeoutError):
        raise StreamsError(f"{subject}: no answer within {wait:g}s") from None
    finally:
        honour_swallowed_cancel()  # nats-py's request may have eaten our caller's cancel
    resp: dict[str, Any] = orjson.loads(msg.data)
    err = resp.get("error")
    if err:
        if err.get("err_code") == STREAM_NOT_FOUND:
            raise StreamMissing(f"stream {subject.rsplit('.', 1)[-1]} not found (run ensure_streams)")
        raise StreamsError(f"{subject}: {err.get('description', err)}")
    return resp


def create_subject(stream: str, config: dict[str, Any]) -> str:
    """`$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]`: the name (and filter) in the subject,
    where NATS permissions can see them (streams.permissions); never the nameless form."""
    subject = f"$JS.API.CONSUMER.CREATE.{stream}.{config['name']}"
    filt = config.get("filter_subject")
    return f"{subject}.{filt}" if filt else subject


def parse_status(hdr: bytes) -> tuple[str, dict[str, str]]:
    """Status code and headers of a status frame (`NATS/1.0 100 Idle Heartbeat\\r\\n...`)."""
    lines = hdr.decode(errors="replace").split("\r\n")
    head = lines[0].split(" ", 2)
    code = head[1] if len(head) > 1 else ""
    headers: dict[str, str] = {"Description": head[2] if len(head) > 2 else ""}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip()] = value.strip()
    return code, headers


# --------------------------------------------------------------------------- consumer


class PushConsumer:
    """Delivers a stream (or a filtered part of it) in order, from a sequence or a time."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        filter_subject: str | None = None,
        idle_heartbeat: float = 2.0,
        raw: bool | None = None,
        expect_created: str | None = None,
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.start_seq = start_seq
        self.start_time = start_time
        self.filter_subject = filter_subject
        self.idle_heartbeat = idle_heartbeat
        self.raw = raw  # None: raw when possible; False: always nats-py
        # The stream's `created` time when reading began: a (re)start on a stream created
        # since would resume at sequences of another log (StreamReplaced instead).
        self.expect_created = expect_created
        # Called after every successful (re)start with the pending count: delivery works again.
        self.on_start: Callable[[int], None] | None = None
        self.last_seq = 0  # stream sequence of the last message handed out
        self.resets = 0
        self.delivering = False  # a consumer exists and delivers (False while recreating it)
        self.foreign = 0  # messages of another consumer delivered to our inbox, dropped
        self.transport = ""  # "raw" | "nats-py", for logs and tests
        self._cseq = 0
        self._name: str | None = None
        self._sink: Sink | None = None
        self._closed = False

    def _config(self, inbox: str) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "deliver_subject": inbox,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(self.idle_heartbeat * 1e9),
            "inactive_threshold": int(max(30.0, 5 * self.idle_heartbeat) * 1e9),
            "mem_storage": True,
            "num_replicas": 1,
            "replay_policy": "instant",
        }
        if self.filter_subject:
            cfg["filter_subject"] = self.filter_subject
        if self.last_seq:
            cfg["deliver_policy"] = "by_start_sequence"
            cfg["opt_start_seq"] = self.last_seq + 1
        elif self.start_seq is not None:
            cfg["deliver_policy"] = "by_start_sequence"
            cfg["opt_start_seq"] = max(1, self.start_seq)
        elif self.start_time is not None:
            cfg["deliver_policy"] = "by_start_time"
            cfg["opt_start_time"] = datetime.fromtimestamp(self.start_time, UTC).isoformat()
        else:
            cfg["deliver_policy"] = "all"
        return cfg

    async def start(self) -> int:
        """Create the consumer; return how many matching messages it has pending."""
        if self.expect_created is not None:
            info = await js_api(self.nc, f"$JS.API.STREAM.INFO.{self.stream}")
            if info.get("created") != self.expect_created:
                raise StreamReplaced(
                    f"stream {self.stream} was created again ({info.get('created')}, "
                    f"read since {self.expect_created})"
                )
        # Subscribe before the consumer exists, so its first message has somewhere to go.
        sink = self._sink = await open_sink(self.nc, self.raw)
        self.transport = sink.transport
        config = {**self._config(sink.inbox), "name": new_id()}
        resp = await js_api(
            self.nc, create_subject(self.stream, config), {"stream_name": self.stream, "config": config}
        )
        self._name = resp["name"]
        self._cseq = 0
        pending = int(resp.get("num_pending", 0))
        self.delivering = True
        if self.on_start is not None:
            self.on_start(pending)
        return pending

    async def _reset(self, why: str) -> None:
        self.resets += 1
        log.info("consumer on %s reset after seq %d: %s", self.stream, self.last_seq, why)
        await self._drop()
        delay = 0.1
        tries = 0
        while not self._closed:
            try:
                await self.start()
                if tries:
                    log.info("consumer on %s recreated after %d failed tries", self.stream, tries)
                return
            except (StreamMissing, StreamReplaced):
                await self._drop()
                raise  # not a transient fault: the caller decides (streams.livefold waits for it)
            except (StreamsError, NatsError, OSError, TimeoutError) as exc:
                tries += 1
                # An outage of any length is retried forever; say so once, then every ~minute.
                if tries == 1 or tries % 30 == 0:
                    log.warning(
                        "consumer on %s: cannot recreate (%s); retrying every %.1fs (try %d)",
                        self.stream,
                        exc,
                        delay,
                        tries,
                    )
                await self._drop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)

    async def _drop(self) -> None:
        self.delivering = False
        sink, self._sink = self._sink, None
        name, self._name = self._name, None
        if sink is not None:
            await sink.close()
        if name is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await js_api(self.nc, f"$JS.API.CONSUMER.DELETE.{self.stream}.{name}")

    async def close(self) -> None:
        """Delete the consumer and stop delivery; a waiting `next_batch()` returns []."""
        self._closed = True
        if self._sink is not None:
            self._sink.wake()
        await self._drop()

    async def next_batch(self) -> list[Delivery]:
        """The next messages in stream order (at least one), or [] once closed."""
        while not self._closed:
            sink = self._sink
            if sink is None:
                await self._reset("no consumer")
                continue
            try:
                frames = await sink.batch(3 * self.idle_heartbeat)
            except StreamsError as exc:
                await self._reset(str(exc))
                continue
            if self._sink is not sink or self._closed:
                continue  # replaced or closed while waiting
            if frames is None:
                await self._reset("no heartbeat")
                continue
            out = await self._handle(sink, frames)
            if out:
                return out
        return []

    async def _handle(self, sink: Sink, frames: list[Frame]) -> list[Delivery]:
        out: list[Delivery] = []
        cseq = self._cseq
        mine = (self._name or "").encode()
        for subject, reply, hdr, data in frames:
            if hdr[:9] == b"NATS/1.0 ":  # a status frame: heartbeat, flow control, 409 ...
                if await self._control(sink, reply, hdr, cseq):
                    break  # consumer replaced; the rest of this batch belongs to the old one
                continue
            if not reply:
                continue
            tokens = reply.split(b".")
            # v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
            # v2: $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<tok>]
            off = 0 if len(tokens) == 9 else 2
            if tokens[3 + off] != mine:
                # Another consumer pointed at our inbox (anyone who may create consumers can):
                # its messages are not ours to hand out.
                self.on_foreign(tokens[3 + off], subject)
                continue
            c = int(tokens[6 + off])
            if c != cseq + 1:
                self._cseq = cseq
                await self._reset(f"gap: consumer seq {c} after {cseq}")
                break
            cseq = c
            seq = int(tokens[5 + off])
            self.last_seq = seq
            out.append(
                Delivery(
                    seq,
                    int(tokens[8 + off]),
                    int(tokens[7 + off]),
                    subject.decode(),
                    data,
                )
            )
        else:
            self._cseq = cseq
        return out

    def on_foreign(self, consumer: bytes, subject: bytes) -> None:
        """A message of another consumer arrived in our inbox: drop it, count it, say so once."""
        self.foreign += 1
        if self.foreign == 1:
            log.warning(
                "consumer %s on %s (after seq %d): dropping messages of consumer %s delivered to its inbox (%s)",
                self._name, self.stream, self.last_seq, consumer.decode(errors="replace"), subject.decode(errors="replace"),
            )  # fmt: skip

    async def _control(self, sink: Sink, reply: bytes, hdr: bytes, cseq: int) -> bool:
        """Handle a status frame; True if the consumer was replaced."""
        code, headers = parse_status(hdr)
        if code == "100":
            if reply:  # flow control request: everything before it has been handed out
                await sink.publish_empty(reply)
                return False
            stalled = headers.get("Nats-Consumer-Stalled")
            if stalled:
                await sink.publish_empty(stalled.encode())
            last = headers.get("Nats-Last-Consumer")
            if last is not None and int(last) > cseq:
                self._cseq = cseq
                await self._reset(f"heartbeat says consumer seq {last}, we have {cseq}")
                return True
            return False
        if code in ("409", "404"):
            self._cseq = cseq
            await self._reset(f"status {code} {headers.get('Description', '')}".strip())
            return True
        return False
