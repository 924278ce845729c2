"""SGLang-style P/D: prefill and decode meet in a bootstrap room on the prefill engine.

The router sends the same request, with `bootstrap_host`, `bootstrap_port` and
`bootstrap_room`, to both engines at once. The prefill engine computes the prompt, fills the
room and holds the KV until the decode engine claims it (bounded by `kv_ttl_s`). The decode
engine calls the prefill engine's bootstrap server (`--bootstrap-port`) and waits, bounded,
for the room to be filled; then it decodes. Aborting either side releases the other: an
aborted prefill empties the room (the decode ends with finish_reason "abort"), and an aborted
or vanished decode closes the room (the prefill stops holding its KV).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
import orjson

from http1.request import Request
from simengine.engine import Engine, Job
from simengine.openai_api import ApiError, Bootstrap, parse_json
from simengine.router import Response, Router, json_response

log = logging.getLogger(__name__)

CLAIM_PATH = "/bootstrap/claim"
ABORT_PATH = "/bootstrap/abort"
_KV_ERROR = "KVTransferError"


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Room:
    """One rendezvous between a prefill request and a decode request."""

    __slots__ = ("aborted", "digest", "filled", "prefill_waiter", "prompt_len", "reaper", "taken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.filled: asyncio.Future[None] = loop.create_future()
        self.prefill_waiter: asyncio.Future[None] | None = None
        self.digest = b""
        self.prompt_len = 0
        self.taken = False
        self.aborted = False
        self.reaper: asyncio.TimerHandle | None = None


class RoomRegistry:
    """The prefill side: rooms by number, and the bootstrap server's routes."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._rooms: dict[int, Room] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def _room(self, room_id: int) -> Room:
        room = self._rooms.get(room_id)
        if room is None:
            loop = asyncio.get_running_loop()
            room = self._rooms[room_id] = Room(loop)
            # A room nobody completes must not live forever.
            self._reap_later(room_id, room, self._engine.settings.kv_ttl_s * 2)
        return room

    def _reap_later(self, room_id: int, room: Room, after: float) -> None:
        if room.reaper is not None:
            room.reaper.cancel()
        room.reaper = asyncio.get_running_loop().call_later(after, self._reap, room_id, room)

    def _reap(self, room_id: int, room: Room) -> None:
        if self._rooms.get(room_id) is room:
            self.abort(room_id, "expired")
            del self._rooms[room_id]

    def abort(self, room_id: int, why: str) -> None:
        """Close a room: whoever waits in it is released; late arrivals find it aborted."""
        room = self._room(room_id)
        if room.taken or room.aborted:
            return
        log.info("bootstrap room %d aborted: %s", room_id, why)
        room.aborted = True
        _wake(room.filled)
        if room.prefill_waiter is not None:
            _wake(room.prefill_waiter)
        # Keep the tombstone a while so a late partner learns the room is gone.
        self._reap_later(room_id, room, self._engine.settings.kv_ttl_s)

    def bind(self, job: Job, room_id: int) -> None:
        """Close the room if this prefill request is aborted."""
        job.on_abort.append(lambda: self.abort(room_id, f"prefill request {job.g.rid} aborted"))

    async def serve(self, job: Job, room_id: int) -> None:
        """Prefill side: fill the room, then hold the KV until the decode claims it."""
        room = self._room(room_id)
        if room.aborted:
            self._engine.abort_job(job)
            return
        room.digest, room.prompt_len = job.digest, job.prompt_len
        _wake(room.filled)
        loop = asyncio.get_running_loop()
        waiter = room.prefill_waiter = loop.create_future()
        timer = loop.call_later(self._engine.settings.kv_ttl_s, _wake, waiter)
        job.waker = waiter
        try:
            await waiter
        finally:
            timer.cancel()
            job.waker = None
            room.prefill_waiter = None
        if room.taken:
            return
        if room.aborted:
            self._engine.abort_job(job)
            return
        self.abort(room_id, "no decode claimed it in time")
        raise ApiError(
            504,
            f"no decode engine claimed bootstrap room {room_id} within {self._engine.settings.kv_ttl_s}s",
            _KV_ERROR,
        )

    async def claim(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Decode side's call: wait for the room to be filled, check it, take the KV."""
        room_id, timeout = body.get("room"), body.get("timeout", 30.0)
        if not isinstance(room_id, int) or not isinstance(timeout, int | float):
            return 400, {"error": "claim needs an integer room and a numeric timeout"}
        room = self._room(room_id)
        try:
            if not room.filled.done():
                await asyncio.wait_for(asyncio.shield(room.filled), timeout)
        except TimeoutError:
            self.abort(room_id, "decode gave up waiting")
            return 504, {"error": f"bootstrap room {room_id} was not filled within {timeout}s"}
        except asyncio.CancelledError:
            self.abort(room_id, "decode went away while waiting")
            raise
        if room.aborted:
            return 410, {"error": f"bootstrap room {room_id} was aborted"}
        if room.taken:
            return 409, {"error": f"bootstrap room {room_id} was already claimed"}
        if body.get("digest") != room.digest.hex() or body.get("prompt_tokens") != room.prompt_len:
            self.abort(room_id, "decode request has a different prompt")
            return 409, {"error": f"bootstrap room {room_id} holds KV of a different prompt"}
        room.taken = True
        if room.prefill_waiter is not None:
            _wake(room.prefill_waiter)
        self._reap_later(room_id, room, 1.0)
        return 200, {"prompt_tokens": room.prompt_len}

    def states(self) -> dict[str, str]:
        """Every known room and its state (for operators and tests)."""
        out = {}
        for room_id, room in self._rooms.items():
            if room.aborted:
                out[str(room_id)] = "aborted"
            elif room.taken:
                out[str(room_id)] = "taken"
            else:
                out[str(room_id)] = "filled" if room.filled.done() else "waiting"
        return out

    def routes(self) -> Router:
        """The bootstrap server: claim, abort, and a health probe."""
        router = Router()
        router.add("POST", CLAIM_PATH, self._claim_handler)
        router.add("POST", ABORT_PATH, self._abort_handler)
        router.add("GET", "/health", lambda req: Response(200))
        router.add("GET", "/bootstrap/rooms", lambda req: json_response(self.states()))
        return router

    async def _claim_handler(self, req: Request) -> Response:
        status, answer = await self.claim(parse_json(req.body))
        return json_response(answer, status)

    def _abort_handler(self, req: Request) -> Response:
        body = parse_json(req.body)
        room_id = body.get("room")
        if not isinstance(room_id, int):
            return json_response({"error": "abort needs an integer room"}, 400)
        self.abort(room_id, str(body.get("reason", "aborted by decode")))
        return json_response({})

    def clear(self) -> None:
        """Release every waiter (shutdown)."""
        for room_id in list(self._rooms):
            self.abort(room_id, "engine stopping")
            reaper = self._rooms[room_id].reaper
            if reaper is not None:
                reaper.cancel()
        self._rooms.clear()


class BootstrapClient:
    """The decode side: claim a room on the prefill engine's bootstrap server."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Future[None]] = set()

    def _spawn_abort(self, base: str, room: int, rid: str) -> None:
        fut = asyncio.ensure_future(self._abort(base, room, rid))
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def claim(self, job: Job, bs: Bootstrap, timeout_s: float) -> None:
        """Wait for the room and take its KV; on abort of this job, close the room."""
        base = f"http://{bs.host}:{bs.port}"
        payload = orjson.dumps(
            {
                "room": bs.room,
                "digest": job.digest.hex(),
                "prompt_tokens": job.prompt_len,
                "timeout": timeout_s,
            }
        )
        task = asyncio.ensure_future(self._post(base + CLAIM_PATH, payload, timeout_s + 5))

        def on_abort() -> None:
            task.cancel()
            self._spawn_abort(base, bs.room, job.g.rid)

        job.on_abort.append(on_abort)
        try:
            status, answer = await task
        except asyncio.CancelledError:
            if job.aborted:
                return
            task.cancel()
            self._spawn_abort(base, bs.room, job.g.rid)
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(502, f"cannot reach bootstrap server {base}: {exc!r}", _KV_ERROR) from None
        finally:
            with contextlib.suppress(ValueError):
                job.on_abort.remove(on_abort)
        why = answer.get("error", "")
        if status == 200:
            job.remote_kv = True
        elif status == 410:
            # The prefill side was aborted: this request ends the same way.
            job.aborted = True
        elif status == 504:
            raise ApiError(504, f"prefill did not fill the room in time: {why}", _KV_ERROR)
        elif status in (400, 409):
            raise ApiError(
                400, f"bootstrap room does not match this request: {why}", _KV_ERROR, "bootstrap_room"
            )
        else:
            raise ApiError(502, f"bootstrap server answered {status}: {why}", _KV_ERROR)

    async def _post(self, url: str, payload: bytes, timeout_s: float) -> tuple[int, dict[str, Any]]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._http().post(url, data=payload, timeout=timeout) as resp:
            raw = await resp.read()
            try:
                answer = orjson.loads(raw)
            except orjson.JSONDecodeError:
                answer = {"error": raw.decode(errors="replace")}
            return resp.status, answer if isinstance(answer, dict) else {"error": str(answer)}

    async def _abort(self, base: str, room: int, rid: str) -> None:
        payload = orjson.dumps({"room": room, "reason": f"decode request {rid} aborted"})
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            await self._post(base + ABORT_PATH, payload, 5.0)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
