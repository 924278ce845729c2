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

from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

from core import subjects
from core.codec import encode
from core.events import EventBase
from streams.ackjournal import AckJournal
from streams.cancelling import honour_swallowed_cancel
from streams.errors import PublishFailed, PublishTimeout, SequenceConflict, StreamsError

MSG_ID = "Nats-Msg-Id"
MOTOR_TYPE = "Motor-Type"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
# With this header the expected sequence is of another subject's last message (a fence).
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071  # JetStream error code: wrong last sequence


def headers_for(event: EventBase) -> dict[str, str]:
    """The headers every Motor message carries."""
    return {MSG_ID: event.id, MOTOR_TYPE: event.type}


def _api_error(exc: APIError, subject: str, expected: int | None) -> StreamsError:
    if exc.err_code == WRONG_LAST_SEQUENCE and expected is not None:
        return SequenceConflict(subject, expected, f"({exc.description})")
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
        hdr = headers_for(event)
        if expected_last_subject_seq is not None:
            hdr[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_subject_seq)
            if expected_subject is not None:
                hdr[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = expected_subject
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
