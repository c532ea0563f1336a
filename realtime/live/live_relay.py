"""GPT-Live sidebands across worker processes: a sideband lands on any worker.

With `parley serve --workers N` the kernel gives a sideband's WebSocket to any worker, and
the session it names may live in another (its owner, in the session's record in Redis). The
worker that took the sideband then relays it over Redis pub/sub, which leaves no keys:

1. it subscribes to the relay's `out` channel (a fresh relay id), then asks the owner
   (process_beat.py's mailbox) to attach a `RelayedSideband` to the session's protocol;
2. the owner subscribes to the relay's `in` channel, then publishes `attached` on `out`
   (or `missing` when the session is not there), so the first message the taker reads
   says whether the sideband exists; only then is the WebSocket accepted (404 otherwise);
3. from then on everything the session's protocol forwards goes out on `out`, in order,
   and every client message on `in` is applied by the owner as a local sideband's would
   be; the session's end publishes `finished` with its reason, after `session.closed`;
4. the sideband's close publishes `detach` on `in`; a taker that sees the owner's
   heartbeat gone closes the sideband (1011) rather than waiting for a `finished` that
   will not come.

Both sides are bounded: a relay that cannot publish its backlog (`BACKLOG` messages) is
ended as a slow client's sideband is, and the taker's socket is fed one message at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from starlette.websockets import WebSocket, WebSocketDisconnect

from pipeline.tasks import TaskSet, cancel_all
from sessions.keys import NAMESPACE
from sessions.process_beat import ProcessBeat, Request

from ..websocket.sender import Message
from .live_errors import live_error
from .live_sideband import DEVICE_ONLY, SESSION_ENDED, LiveSessions

if TYPE_CHECKING:
    from .live_protocol import LiveProtocol

log = logging.getLogger("parley.realtime.live")

OP = "live_attach"
ATTACHED, MISSING, FINISHED, DETACH = "attached", "missing", "finished", "detach"
BACKLOG = 256
"""Messages a relay may hold that Redis has not taken yet; past this it ends (slow)."""
ASK_S = 3.0
"""How long the taker waits for the owner to answer, then for its first message."""
OWNER_CHECK_S = 1.0
"""How often the taker checks that the owner still beats."""
SEND_S = 5.0
"""How long the taker waits for its client to take one message; past it the client is slow
and the sideband is closed (1008), as a local sideband's would be."""


def channels(relay_id: str, namespace: str = NAMESPACE) -> tuple[str, str]:
    """The relay's `out` (owner -> taker) and `in` (taker -> owner) channels."""
    base = f"{namespace}:live-relay:{relay_id}"
    return f"{base}:out", f"{base}:in"


def control(kind: str, **fields: Any) -> str:
    return json.dumps({"relay": kind, **fields})


def _relay_kind(data: str) -> str | None:
    """The relay's own word in a message, None for a session's message."""
    if not data.startswith('{"relay"'):
        return None
    with contextlib.suppress(ValueError):
        body = json.loads(data)
        if isinstance(body, dict) and isinstance(body.get("relay"), str):
            return str(body["relay"])
    return None


class RelayedSideband:
    """The owner's side of one relayed sideband: a `Sideband` of the session's protocol."""

    def __init__(self, redis: aioredis.Redis, protocol: LiveProtocol, relay_id: str) -> None:
        self._redis = redis
        self.protocol = protocol
        self.out, self.inbox = channels(relay_id)
        self._queue: asyncio.Queue[str] = asyncio.Queue(BACKLOG)
        self._done = asyncio.Event()
        self.finished = False

    def forward(self, message: Message) -> None:
        self._put(json.dumps(message))
        if message.get("type") == "session.closed":
            self.finish(SESSION_ENDED)

    def finish(self, reason: str) -> None:
        if not self.finished:
            self.finished = True
            self._put(control(FINISHED, reason=reason), last=True)

    def _put(self, data: str, last: bool = False) -> None:
        if self._done.is_set():
            return
        try:
            self._queue.put_nowait(data)
        except asyncio.QueueFull:  # the relay cannot keep up: it ends, as a slow client
            log.warning("live relay %s: backlog full, ending it", self.out)
            self.protocol.detach_sideband(self)
            self._done.set()
        if last:
            self.protocol.detach_sideband(self)

    async def run(self, attached: bool) -> None:
        """Listen on `in` first, then say whether it attached, then relay until done."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.inbox)
            await self._redis.publish(self.out, control(ATTACHED if attached else MISSING))
            if not attached:
                return
            async with asyncio.TaskGroup() as tasks:
                publishing = tasks.create_task(self._publish())
                listening = tasks.create_task(self._listen(pubsub))
                await self._done.wait()
                publishing.cancel()
                listening.cancel()
        except (RedisError, OSError) as exc:
            log.warning("live relay %s failed: %s", self.out, exc)
        finally:
            self.protocol.detach_sideband(self)
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    async def _publish(self) -> None:
        while True:
            data = await self._queue.get()
            await self._redis.publish(self.out, data)
            if _relay_kind(data) == FINISHED:
                self._done.set()
                return

    async def _listen(self, pubsub: Any) -> None:
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is None or message.get("type") != "message":
                continue
            raw = message["data"]
            data = raw.decode() if isinstance(raw, bytes) else str(raw)
            if _relay_kind(data) == DETACH:
                self._done.set()
                return
            await self.protocol.handle_raw(data)


class LiveRelays:
    """The owner's relays, one task each, owned here until `close`."""

    def __init__(self, redis: aioredis.Redis, live_sessions: LiveSessions) -> None:
        self._redis = redis
        self._live_sessions = live_sessions
        self._tasks = TaskSet("live-relays")
        """Owns each relay run here; `close()` closes it."""

    async def on_request(self, request: Request) -> None:
        """Another worker asks to relay a sideband of a session here (`OP`)."""
        relay_id = str(request.get("relay", ""))
        protocol = self._live_sessions.get(str(request.get("session_id")))
        if not relay_id or self._tasks.closed:
            return
        if protocol is None:
            await self._redis.publish(channels(relay_id)[0], control(MISSING))
            return
        relay = RelayedSideband(self._redis, protocol, relay_id)
        attached = protocol.attach_sideband(relay)
        self._tasks.create_task(relay.run(attached), name=f"live-relay:{relay_id}")

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        await self._tasks.close()


async def relay_sideband(
    websocket: WebSocket, redis: aioredis.Redis, beat: ProcessBeat, owner: str, session_id: str
) -> bool:
    """The taker's side: serve `websocket` (not yet accepted) as a sideband of the session
    its `owner` process holds. False, with the socket untouched, when the owner has no
    such session (the caller refuses it, 404)."""
    relay_id = secrets.token_hex(8)
    out, inbox = channels(relay_id)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(out)
        request = {"op": OP, "session_id": session_id, "relay": relay_id}
        if not await beat.ask(owner, request, ASK_S):
            return False
        first = await _next(pubsub, ASK_S)
        if first is None or _relay_kind(first) != ATTACHED:
            return False
        await websocket.accept()
        async with asyncio.TaskGroup() as tasks:
            down = tasks.create_task(_down(websocket, pubsub, beat, owner))
            up = tasks.create_task(_up(websocket, redis, inbox))
            await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_all([down, up])
        return True
    finally:
        with contextlib.suppress(RedisError, OSError):
            await redis.publish(inbox, control(DETACH))
        with contextlib.suppress(RedisError, OSError):
            await pubsub.aclose()


async def _next(pubsub: Any, within_s: float) -> str | None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            while True:
                message = await pubsub.get_message(timeout=within_s)
                if message is not None and message.get("type") == "message":
                    raw = message["data"]
                    return raw.decode() if isinstance(raw, bytes) else str(raw)
    return None


async def _down(websocket: WebSocket, pubsub: Any, beat: ProcessBeat, owner: str) -> None:
    """The session's messages to the sideband, until the session ends or its owner dies."""
    loop = asyncio.get_running_loop()
    checked = loop.time()
    while True:
        data = await _next(pubsub, OWNER_CHECK_S)
        if data is not None:
            if _relay_kind(data) == FINISHED:
                with contextlib.suppress(Exception):
                    await websocket.close(1000, SESSION_ENDED)
                return
            try:
                async with asyncio.timeout(SEND_S):
                    await websocket.send_text(data)
            except TimeoutError:
                with contextlib.suppress(Exception):
                    await websocket.close(1008, "the sideband stopped reading")
                return
            except Exception:  # the client has gone
                return
        if loop.time() - checked >= OWNER_CHECK_S:
            checked = loop.time()
            if not await beat.alive(owner):
                with contextlib.suppress(Exception):
                    await websocket.close(1011, "the session's server process has gone")
                return


async def _up(websocket: WebSocket, redis: aioredis.Redis, inbox: str) -> None:
    """The sideband's client events to the owner, but what only the device may send."""
    while True:
        try:
            raw = await websocket.receive_text()
        except (WebSocketDisconnect, RuntimeError, KeyError):
            return
        kind, event_id = _kind(raw)
        error = None
        if kind in DEVICE_ONLY:
            why = f"{kind} comes from the session's own connection, not a sideband"
            error = live_error("invalid_request", why, event_id, param="type")
        elif _relay_kind(raw) is not None:
            error = live_error("invalid_event", "an event is a JSON object with a `type`")
        if error is None:
            await redis.publish(inbox, raw)
            continue
        try:
            await websocket.send_text(json.dumps(error))
        except Exception:  # the client has gone
            return


def _kind(raw: str) -> tuple[str | None, str | None]:
    with contextlib.suppress(ValueError):
        event = json.loads(raw)
        if isinstance(event, dict):
            kind, event_id = event.get("type"), event.get("event_id")
            return (
                kind if isinstance(kind, str) else None,
                event_id if isinstance(event_id, str) else None,
            )
    return None, None
