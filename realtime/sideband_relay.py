"""Sidebands across worker processes: a sideband lands on any worker, its session may not.

With `parley serve --workers N` the kernel gives a sideband's WebSocket (GPT-Live's
`/v1/live/sessions/{id}/attach`, OpenAI Realtime's `/v1/realtime?call_id=`) to any worker,
and what it names may live in another: its owner. The worker that took the WebSocket (the
taker) relays it to the owner over Redis pub/sub, reaching it as every relay does
(owner_relay.py: pub/sub, which leaves no keys behind, the owner's mailbox, heartbeats
checked while waiting), and the owner serves it exactly as it serves a local one: its
protocol's own sideband code runs on a `WebSocket` whose ASGI channel is the relay
(`RelayedSocket`). So a protocol supplies one thing, how to serve a sideband of one of its
sessions or calls on a WebSocket (a `Find`), and everything a local sideband does (what it
is sent, how its client events apply, its refusals, its close codes and reasons, its
bounded sender and slow-client rule) holds for a relayed one too.

1. The taker subscribes to the relay's `out` channel (a fresh relay id), then asks the
   owner (process_beat.py's mailbox) to serve the sideband (`OP`, naming the protocol
   and the target: a session id, a call id).
2. The owner answers `missing` on `out` when it has no such target. Otherwise it
   subscribes to the relay's `in` channel and serves the sideband: the protocol's
   `accept()` publishes `attached`, so the first message the taker reads says whether
   the sideband exists; only then does the taker accept its WebSocket (404 otherwise).
3. Then each message the owner's connection sends goes out on `out`, in order, and each
   client message goes in on `in`; the owner's close publishes `finished` with its code
   and reason, which the taker's client gets as its close frame.
4. The client's close publishes `detach` (with its close code) on `in`. Each side checks
   the other's heartbeat while it waits (`RelayListener.heard`): a taker whose owner has
   gone closes its client (1011); an owner whose taker has gone ends the relayed
   connection as a dropped one.

Every pub/sub message is one tag character and a body: `m` a text message, `b` a binary
one (base64), `c` the relay's own control word (JSON), so no client message can pass for
the relay's own. The owner's side is bounded by the connection's own sender (its queue,
its stall limit); the taker feeds its client one message at a time, each within `SEND_S`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from starlette import status
from starlette.types import Message as AsgiMessage
from starlette.websockets import WebSocket, WebSocketDisconnect

from pipeline.tasks import TaskSet, cancel_all
from sessions.keys import NAMESPACE
from sessions.process_beat import ProcessBeat, Request

from .owner_relay import RelayListener, new_relay_id, other_live_owner, relay_channel
from .slow_clients import CLOSE_TOO_SLOW, TOO_SLOW

log = logging.getLogger("parley.realtime.sideband_relay")

OP = "sideband_relay"
ATTACHED, MISSING, FINISHED, DETACH = "attached", "missing", "finished", "detach"
TEXT, BINARY, CONTROL = "m", "b", "c"
ASK_S = 3.0
"""How long the taker waits for the owner to answer, then for its first message."""
SEND_S = 5.0
"""How long the taker waits for its client to take one message; past it the client is slow
and the sideband is closed (1008), as a local sideband's would be."""
OWNER_GONE = "the session's server process has gone"

Serve = Callable[[WebSocket, str | None], Awaitable[None]]
"""Serve one sideband on a WebSocket not yet accepted, with the subprotocol the client
chose (the protocol's local sideband code)."""
Find = Callable[[str], Serve | None]
"""A protocol's target (a session id, a call id) -> how to serve a sideband of it here;
None when this process has no such target, or it has ended."""


def channels(relay_id: str, namespace: str = NAMESPACE) -> tuple[str, str]:
    """The relay's `out` (owner -> taker) and `in` (taker -> owner) channels."""
    base = relay_channel("sideband-relay", relay_id, namespace)
    return f"{base}:out", f"{base}:in"


def control(kind: str, **fields: Any) -> str:
    return CONTROL + json.dumps({"relay": kind, **fields})


def parse_control(data: str) -> dict[str, Any] | None:
    """The relay's control word in a pub/sub message; None for a relayed message."""
    if not data.startswith(CONTROL):
        return None
    with contextlib.suppress(ValueError):
        body = json.loads(data[1:])
        if isinstance(body, dict) and isinstance(body.get("relay"), str):
            return body
    return None


def _wire(text: str | None, data: bytes | None) -> str:
    if text is not None:
        return TEXT + text
    return BINARY + base64.b64encode(data or b"").decode("ascii")


def _asgi_receive(data: str) -> AsgiMessage | None:
    if data.startswith(TEXT):
        return {"type": "websocket.receive", "text": data[1:]}
    if data.startswith(BINARY):
        with contextlib.suppress(ValueError):
            return {"type": "websocket.receive", "bytes": base64.b64decode(data[1:])}
    return None


class RelayedSocket:
    """The owner's side of one relay: a Starlette `WebSocket` whose ASGI channel is the
    relay, for the protocol's sideband code to serve as it serves a client's socket."""

    def __init__(self, redis: aioredis.Redis, beat: ProcessBeat, relay_id: str, taker: str) -> None:
        self._redis = redis
        self.out, self.inbox = channels(relay_id)
        self._listener = RelayListener(redis, beat, taker)
        self._connected = False
        self.finished = False
        scope = {"type": "websocket", "path": "/relayed-sideband", "headers": []}
        self.websocket = WebSocket(scope, self._receive, self._send)

    async def open(self) -> None:
        """Listen on `in` (before `attached` goes out: nothing the taker sends is lost)."""
        await self._listener.subscribe(self.inbox)

    async def aclose(self) -> None:
        """The relay's end: a sideband that ended without a close frame ends the taker's
        client with 1011. Idempotent."""
        if not self.finished:
            with contextlib.suppress(OSError):
                await self._send(
                    {
                        "type": "websocket.close",
                        "code": status.WS_1011_INTERNAL_ERROR,
                        "reason": "the sideband ended",
                    }
                )
        await self._listener.aclose()

    async def _receive(self) -> AsgiMessage:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        try:
            while True:
                data = await self._listener.heard()
                if data is None:  # the taker has gone
                    return {"type": "websocket.disconnect", "code": 1006}
                body = parse_control(data)
                if body is not None:
                    if body["relay"] == DETACH:
                        return {"type": "websocket.disconnect", "code": body.get("code", 1006)}
                    continue
                message = _asgi_receive(data)
                if message is not None:
                    return message
        except (RedisError, OSError) as exc:
            log.info("relay %s: lost its Redis channel: %s", self.inbox, exc)
            return {"type": "websocket.disconnect", "code": 1006}

    async def _send(self, message: AsgiMessage) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            data = control(ATTACHED, subprotocol=message.get("subprotocol"))
        elif kind == "websocket.send":
            data = _wire(message.get("text"), message.get("bytes"))
        elif kind == "websocket.close":
            self.finished = True
            code = message.get("code") or status.WS_1000_NORMAL_CLOSURE
            data = control(FINISHED, code=code, reason=message.get("reason") or "")
        else:  # a denial response: a relayed sideband has been found, nothing to deny
            raise RuntimeError(f"a relayed sideband cannot send {kind}")
        try:
            await self._redis.publish(self.out, data)
        except RedisError as exc:  # as a socket's write fails: the client is gone
            raise OSError(f"relay {self.out}: {exc}") from exc


class SidebandRelays:
    """The owner's side for every protocol: serves the sidebands other workers relay
    here, one task each, owned here until `close`."""

    def __init__(self, redis: aioredis.Redis, beat: ProcessBeat) -> None:
        self._redis = redis
        self._beat = beat
        self._finders: dict[str, Find] = {}
        self._tasks = TaskSet("sideband-relays")

    def serve(self, protocol: str, find: Find) -> None:
        """Serve relayed sidebands of `protocol`, finding their targets with `find`."""
        self._finders[protocol] = find

    def __len__(self) -> int:
        return len(self._tasks)

    async def on_request(self, request: Request) -> None:
        """Another worker asks to relay a sideband here (`OP`)."""
        relay_id, taker = str(request.get("relay", "")), str(request.get("taker", ""))
        if not relay_id:
            return
        find = self._finders.get(str(request.get("protocol")))
        serve = find(str(request.get("target"))) if find is not None else None
        if serve is None:
            await self._redis.publish(channels(relay_id)[0], control(MISSING))
            return
        subprotocol = request.get("subprotocol")
        chosen = subprotocol if isinstance(subprotocol, str) else None
        if self._tasks.closed:
            return
        self._tasks.create_task(
            self._relay(relay_id, taker, serve, chosen), name=f"sideband-relay:{relay_id}"
        )

    async def _relay(
        self, relay_id: str, taker: str, serve: Serve, subprotocol: str | None
    ) -> None:
        socket = RelayedSocket(self._redis, self._beat, relay_id, taker)
        try:
            await socket.open()
            await serve(socket.websocket, subprotocol)
        except (RedisError, OSError) as exc:
            log.warning("sideband relay %s failed: %s", relay_id, exc)
        finally:
            await socket.aclose()

    async def close(self) -> None:
        await self._tasks.close()


async def relay_sideband(
    websocket: WebSocket,
    redis: aioredis.Redis,
    beat: ProcessBeat,
    owner: str | None,
    request: Request,
) -> bool:
    """The taker's side: serve `websocket` (not yet accepted) as a sideband of what
    `request` names (`protocol`, `target`, `subprotocol`), held by the `owner` process.
    False, with the socket untouched, when no other live process has it (the caller
    refuses it, 404)."""
    owner = await other_live_owner(beat, owner)
    if owner is None:
        return False
    relay_id = new_relay_id()
    out, inbox = channels(relay_id)
    detach_code = 1006
    try:
        async with RelayListener(redis, beat, owner) as listener:
            ask = {**request, "op": OP, "relay": relay_id, "taker": beat.process_id}
            if not await listener.reach(out, ask, ASK_S):
                return False
            first = await listener.next(ASK_S)
            attached = parse_control(first) if first is not None else None
            if attached is None or attached["relay"] != ATTACHED:
                return False
            subprotocol = attached.get("subprotocol")
            chosen = subprotocol if isinstance(subprotocol, str) else None
            await websocket.accept(subprotocol=chosen)
            async with asyncio.TaskGroup() as tasks:
                down = tasks.create_task(_down(websocket, listener))
                up = tasks.create_task(_up(websocket, redis, inbox))
                await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
                if up.done() and not up.cancelled():
                    detach_code = up.result()
                await cancel_all([down, up])
            return True
    finally:
        with contextlib.suppress(RedisError, OSError):
            await redis.publish(inbox, control(DETACH, code=detach_code))


async def _down(websocket: WebSocket, listener: RelayListener) -> None:
    """The owner's messages to the client, until the owner closes or has gone."""
    try:
        while True:
            data = await listener.heard()
            if data is None:
                await _close(websocket, status.WS_1011_INTERNAL_ERROR, {"reason": OWNER_GONE})
                return
            body = parse_control(data)
            if body is not None and body["relay"] == FINISHED:
                code = body.get("code")
                await _close(websocket, code if isinstance(code, int) else 1000, body)
                return
            if body is None and not await _deliver(websocket, data):
                return
    except (RedisError, OSError) as exc:
        log.info("sideband relay: lost its Redis channel: %s", exc)
        await _close(websocket, status.WS_1011_INTERNAL_ERROR, {"reason": "relay lost"})


async def _close(websocket: WebSocket, code: int, body: dict[str, Any]) -> None:
    reason = body.get("reason")
    with contextlib.suppress(Exception):  # the client may have gone
        await websocket.close(code, reason if isinstance(reason, str) else None)


async def _deliver(websocket: WebSocket, data: str) -> bool:
    """One relayed message to the client; False once the connection is over (the client
    has gone, or it stopped reading and was closed)."""
    message = _asgi_receive(data)  # the same tags both ways
    if message is None:
        return True
    try:
        async with asyncio.timeout(SEND_S):
            if "text" in message:
                await websocket.send_text(message["text"])
            else:
                await websocket.send_bytes(message["bytes"])
    except TimeoutError:
        with contextlib.suppress(Exception):
            await websocket.close(CLOSE_TOO_SLOW, TOO_SLOW)
        return False
    except Exception:  # the client has gone
        return False
    return True


async def _up(websocket: WebSocket, redis: aioredis.Redis, inbox: str) -> int:
    """The client's messages to the owner, until it goes: returns its close code."""
    while True:
        try:
            message = await websocket.receive()
        except (WebSocketDisconnect, RuntimeError) as exc:
            return getattr(exc, "code", 1006)
        if message["type"] == "websocket.disconnect":
            code = message.get("code")
            return code if isinstance(code, int) else 1006
        text, data = message.get("text"), message.get("bytes")
        if text is None and data is None:
            continue
        try:
            await redis.publish(inbox, _wire(text, data))
        except (RedisError, OSError) as exc:
            log.info("sideband relay %s: lost its Redis channel: %s", inbox, exc)
            return 1006
