"""The coordinator's fold of the `motor_kvview` bucket into its `KvView` (for kv_aware).

An ordered consumer of the bucket's stream from its first message: the bucket keeps one value
a key, so a new replica reads every endpoint's latest view at once and then each change, the
same values in the same order as every other replica. Through an outage the consumer is
recreated from the last message it handed out (`streams.consumer`), so the view catches up
when NATS is back; meanwhile routing goes on with the view it has. A failure of the consumer
itself starts it over from the bucket's first message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from core import subjects
from core.kvblocks import KvView
from streams.definitions import KVVIEW_BUCKET, kv_stream
from streams.log import Delivery, Log

log = logging.getLogger(__name__)

_PREFIX = f"$KV.{KVVIEW_BUCKET}."
RETRY = 1.0


def fold_delivery(view: KvView, d: Delivery) -> None:
    """One bucket message: a value replaces its endpoint's view, an empty one (a delete) drops it."""
    if not d.subject.startswith(_PREFIX):
        return
    key = subjects.kv_view_endpoint(d.subject[len(_PREFIX) :])
    if key is None:
        view.undecodable += 1
        return
    view.apply(key, d.data or None)


class KvFeed:
    """Follows the bucket into `view` until closed."""

    def __init__(self, view: KvView, motor: Log) -> None:
        self.view = view
        self.motor = motor
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start following (on the running loop)."""
        self._task = asyncio.create_task(self._run(), name="kvfeed")

    async def _run(self) -> None:
        while True:
            consumer = self.motor.ordered(kv_stream(KVVIEW_BUCKET))
            try:
                await consumer.start()
                while True:
                    batch = await consumer.next_batch()
                    if not batch:
                        return
                    for d in batch:
                        fold_delivery(self.view, d)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the stream away or replaced: start over from its first message
                self.restarts += 1
                log.warning("KV view feed stopped (%s); starting over in %.0f s", exc, RETRY)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.close()
            await asyncio.sleep(RETRY)

    async def close(self) -> None:
        """Stop following."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
