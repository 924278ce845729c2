"""The precision detector hook: sample finished responses, append an alarm for garbage.

Runs after a response is complete, only for the sampled fraction; the check and the publish
never delay a client. The alarm names the decode (or union) instance and its prefill peer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from coordinator.context import CoordinatorContext
from coordinator.detector import PrecisionDetector
from coordinator.proxy.continuation import ProgressFold, progress_of
from coordinator.proxy.deliver import Delivery

log = logging.getLogger(__name__)


def response_text(d: Delivery) -> str:
    """The generated text of a finished request's response (JSON or SSE), "" if none."""
    if isinstance(d.resp_body, ProgressFold):  # a long event stream
        return d.resp_body.result().text
    if not d.resp_body:
        return ""
    if d.ask.stream:
        return progress_of(b"".join(d.resp_body)).text
    data = b"".join(d.resp_body)
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    msg = c.get("message")
    if isinstance(msg, dict) and isinstance(msg.get("content"), str):
        return str(msg["content"])
    text = c.get("text")
    return text if isinstance(text, str) else ""


class PrecisionHook:
    """Called with every finished request (`Pipeline.on_done`); only generation answers are
    sampled (an engine-native route's body is no OpenAI answer)."""

    def __init__(self, ctx: CoordinatorContext, detector: PrecisionDetector | None = None) -> None:
        self.ctx = ctx
        self.detector = detector or PrecisionDetector(ctx.settings.precision_detector)
        self._tasks: set[asyncio.Task[Any]] = set()

    def __call__(self, d: Delivery) -> None:
        ep = d.served_by
        if ep is None or d.status != 200 or d.ask.route.native or not self.detector.should_sample():
            return
        self.ctx.metrics.precision_checks.inc()
        reason = self.detector.check(response_text(d))
        if reason is None:
            return
        p = d.prefill_by
        event = self.detector.alarm(
            d_instance_id=ep.instance_id,
            p_instance_id=p.instance_id if p is not None else None,
            reason=reason,
            request_id=d.ask.root,
            source=self.ctx.source,
            ts=time.time(),
        )
        self.ctx.metrics.precision_alarms.labels(detector="coordinator").inc()
        log.warning("precision alarm on instance %d: %s", ep.instance_id, reason)
        publisher = self.ctx.publisher
        if publisher is not None:
            task = asyncio.get_running_loop().create_task(publisher.publish(event))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("could not append precision alarm: %s", task.exception())
