"""Appending events: acked publish, a bounded async window, dedupe and optimistic concurrency.

Every message carries `Nats-Msg-Id = event.id` (a retried publish inside the dedupe window
is dropped by the server) and `Motor-Type = event.type`. A decision guarded by
`expected_last_subject_seq` lands only if its entity's subject has not moved since the
caller looked: two controllers can never both write a decision for one entity.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

from core import subjects
from core.codec import encode
from core.events import EventBase
from core.ids import new_id
from streams.ackjournal import AckJournal
from streams.batch import ATOMIC_DISABLED, BatchRefused, batch_headers, publish_in_chunks, read_batch_ack
from streams.cancelling import honour_swallowed_cancel
from streams.errors import PublishFailed, PublishTimeout, SequenceConflict, StoreFull, StreamsError

MSG_ID = "Nats-Msg-Id"
MOTOR_TYPE = "Motor-Type"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
# With this header the expected sequence is of another subject's last message (a fence).
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071  # JetStream error code: wrong last sequence
# JetStream error codes of a store that is full: the stream's max_bytes (discard new), the
# server's store (max_file_store) or the account's storage; which limit each names.
STORE_FULL = {
    10077: "MOTOR is at its nats.max_bytes",
    10023: "the nats-server's JetStream store is full (its max_file_store)",
    10047: "the JetStream storage of the server or account is full",
}
FULL_ADVICE = (
    "nothing was stored (Motor's processes keep their events and send them again); free room by "
    "raising nats.max_bytes (and the disk under the server's store), or by exporting "
    "(`motor events export`) and purging old events, or wait for nats.max_age_days to age them out"
)


def headers_for(
    event: EventBase, expected_last_subject_seq: int | None = None, expected_subject: str | None = None
) -> dict[str, str]:
    """The headers every Motor message carries, and the guard when there is one (see `publish`)."""
    hdr = {MSG_ID: event.id, MOTOR_TYPE: event.type}
    if expected_last_subject_seq is not None:
        hdr[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_subject_seq)
        if expected_subject is not None:
            hdr[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = expected_subject
    return hdr


def _api_error(exc: APIError, subject: str, expected: int | None) -> StreamsError:
    if exc.err_code == WRONG_LAST_SEQUENCE and expected is not None:
        return SequenceConflict(subject, expected, f"({exc.description})")
    full = STORE_FULL.get(exc.err_code or 0)
    if full is not None:
        return StoreFull(f"{subject}: refused, {full} ({exc.description}): {FULL_ADVICE}")
    return PublishFailed(f"{subject}: {exc.description or exc}")


class Publisher:
    """Publishes events to JetStream; one per process is enough (it is not tied to a subject)."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        window: int = 256,
        ack_timeout: float = 5.0,
        journal: AckJournal | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.js = js
        self.window = window
        self.ack_timeout = ack_timeout
        # Every ack noted when the environment asks for it (streams.ackjournal).
        self.journal = journal if journal is not None else AckJournal.from_env()
        # (deadline, subject, event, ack future), oldest first: nats-py's futures never time out.
        self._pending: collections.deque[tuple[float, str, EventBase, asyncio.Future[PubAck]]] = (
            collections.deque()
        )
        self._error: StreamsError | None = None
        # Acks of `publish_batch`, on an inbox of our own: reply token -> future of the raw ack
        # (nats-py's `publish_async` raises a refusal in its reply handler instead of failing
        # the future, so a moved fence would read as a timeout).
        self._acks: dict[str, asyncio.Future[bytes]] = {}
        self._atomic: bool | None = None  # whether the stream takes atomic batches (None: not tried)
        self._ack_prefix: str | None = None
        self._ack_count = 0

    async def publish(
        self,
        event: EventBase,
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
    ) -> int:
        """Publish and wait for the ack; return the stream sequence (the original's on a duplicate).

        `expected_last_subject_seq` guards the event's own subject, or `expected_subject`
        when given (a fence: the event lands only while that subject has not moved).
        """
        subject = subjects.for_event(event)
        hdr = headers_for(event, expected_last_subject_seq, expected_subject)
        try:
            ack = await self.js.publish(subject, encode(event), timeout=self.ack_timeout, headers=hdr)
        except APIError as exc:
            raise _api_error(exc, expected_subject or subject, expected_last_subject_seq) from None
        except (NatsTimeoutError, TimeoutError):
            raise PublishTimeout(f"{subject}: no ack within {self.ack_timeout}s") from None
        except (NoStreamResponseError, NoRespondersError):
            raise PublishFailed(f"{subject}: no stream takes this subject (run ensure_streams)") from None
        except NatsError as exc:  # reconnecting, connection closed, buffer full: not landed (yet)
            raise PublishFailed(f"{subject}: {exc or type(exc).__name__}") from None
        finally:
            honour_swallowed_cancel()  # nats-py's request may have eaten our caller's cancel
        self._acked(event, ack)
        return int(ack.seq)

    def _acked(self, event: EventBase, ack: PubAck) -> None:
        if self.journal is not None:
            self.journal.record(event.id, event.type, ack.stream, int(ack.seq), bool(ack.duplicate))

    async def publish_batch(
        self,
        events: Sequence[EventBase],
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
        go_on: Callable[[], bool] | None = None,
    ) -> list[int | StreamsError]:
        """Publish in order, each guarded as `publish` guards one, all or nothing a chunk at a
        time (`streams.batch`); return every outcome in order: the stream sequence, or the
        error. Nothing more is sent once `go_on()` is false or a chunk failed, so the list may
        end early."""
        return await publish_in_chunks(
            events,
            atomic=lambda chunk: self._atomic_batch(chunk, expected_last_subject_seq, expected_subject),
            one=lambda event: self.publish(
                event, expected_last_subject_seq=expected_last_subject_seq, expected_subject=expected_subject
            ),
            go_on=go_on,
        )

    async def _atomic_batch(
        self, events: Sequence[EventBase], expected: int | None, guard: str | None
    ) -> list[int | StreamsError] | None:
        """One atomic batch, one ack; None when the stream refuses it as a batch."""
        if self._atomic is False:
            return None
        nc: Client = self.js._nc
        batch_id = new_id()
        last = len(events) - 1
        first_subject = subjects.for_event(events[0])
        fut: asyncio.Future[bytes] | None = None
        try:
            for i, event in enumerate(events):
                hdr = headers_for(event, expected, guard)
                hdr.update(batch_headers(batch_id, i, commit=i == last))
                body = encode(event)
                if i == last:
                    fut = await self._send(subjects.for_event(event), body, hdr)
                else:
                    await nc.publish(subjects.for_event(event), body, headers=hdr)
        except NatsError as exc:  # not all sent: an uncommitted batch is dropped by the server
            return [PublishFailed(f"{first_subject}: {exc or type(exc).__name__}")] * len(events)
        assert fut is not None
        try:
            async with asyncio.timeout(self.ack_timeout):  # not wait_for: it can eat a cancel
                raw = await asyncio.shield(fut)
        except TimeoutError:
            fut.cancel()
            # All of it landed or none of it: the next decide finds out from the log.
            return [PublishTimeout(f"{first_subject}: no ack of a batch within {self.ack_timeout}s")] * len(
                events
            )
        except NoRespondersError:
            return [
                PublishFailed(f"{first_subject}: no stream takes this subject (run ensure_streams)")
            ] * len(events)
        verdict = read_batch_ack(raw, len(events))
        if isinstance(verdict, BatchRefused):
            if verdict.code == ATOMIC_DISABLED:
                self._atomic = False
            return None
        if isinstance(verdict, APIError):
            return [_api_error(verdict, guard or first_subject, expected)] * len(events)
        if isinstance(verdict, str):  # the server stored them one by one: it knows no batches
            self._atomic = False
            return [PublishFailed(f"{first_subject}: {verdict}")] * len(events)
        self._atomic = True
        stream, seqs = verdict
        if self.journal is not None:
            for event, seq in zip(events, seqs, strict=True):
                self.journal.record(event.id, event.type, stream, seq, False)
        return list(seqs)

    async def _send(self, subject: str, body: bytes, hdr: dict[str, str]) -> asyncio.Future[bytes]:
        """Publish with a reply subject of our ack inbox; the future gets the raw reply."""
        nc: Client = self.js._nc
        if self._ack_prefix is None:
            prefix = nc.new_inbox()
            await nc.subscribe(f"{prefix}.*", cb=self._on_ack)
            self._ack_prefix = prefix
        self._ack_count += 1
        token = str(self._ack_count)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._acks[token] = fut
        fut.add_done_callback(lambda _: self._acks.pop(token, None))
        await nc.publish(subject, body, reply=f"{self._ack_prefix}.{token}", headers=hdr)
        return fut

    async def _on_ack(self, msg: Msg) -> None:
        fut = self._acks.get(msg.subject.rsplit(".", 1)[1])
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            fut.set_exception(NoRespondersError())
        else:
            fut.set_result(msg.data)

    async def publish_async(self, event: EventBase) -> None:
        """Publish without waiting for the ack; waits only when `window` acks are outstanding.

        Errors (and ack timeouts) of earlier publishes are raised here and by `flush`.
        """
        self._raise_pending_error()
        while len(self._pending) >= self.window:
            await self._settle_oldest()
            self._raise_pending_error()
        subject = subjects.for_event(event)
        fut = await self.js.publish_async(subject, encode(event), headers=headers_for(event))
        self._pending.append((time.monotonic() + self.ack_timeout, subject, event, fut))

    async def flush(self) -> None:
        """Wait for every outstanding ack; raise the first error seen since the last flush."""
        while self._pending:
            await self._settle_oldest()
        self._raise_pending_error()

    @property
    def outstanding(self) -> int:
        """Publishes whose ack has not been seen yet."""
        return len(self._pending)

    def _raise_pending_error(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise err

    async def _settle_oldest(self) -> None:
        deadline, subject, event, fut = self._pending.popleft()
        remaining = deadline - time.monotonic()
        try:
            if not fut.done():
                async with asyncio.timeout(max(remaining, 0.0)):  # not wait_for: it can eat a cancel
                    await asyncio.shield(fut)
            self._acked(event, fut.result())
        except TimeoutError:
            fut.cancel()
            self._note(PublishTimeout(f"{subject}: no ack within {self.ack_timeout}s"))
        except APIError as exc:
            self._note(_api_error(exc, subject, None))
        except asyncio.CancelledError:
            if fut.cancelled():
                self._note(PublishFailed(f"{subject}: publish cancelled (connection closed?)"))
            else:
                raise

    def _note(self, err: StreamsError) -> None:
        if self._error is None:
            self._error = err
