"""Reaching the worker process that owns a session or call: what every relay shares.

With `parley serve --workers N` the kernel gives a request or a WebSocket to any worker (the
taker), and the session or call it names may live in another (the owner). Two relays carry
it there, each for what it carries: request_relay.py an HTTP request (call control, hang-ups),
sideband_relay.py a sideband's WebSocket. Both reach the owner the same way, here:

1. A fresh relay id names the relay's pub/sub channels (`relay_channel`): pub/sub leaves no
   keys behind and reaches every node of a Redis Cluster.
2. The taker listens on the channel the owner speaks on before it asks anything, so no word
   is lost, then hands its request to the owner's mailbox (process_beat.py): asked (the
   mailbox answers once the owner has handled it) or told (the owner answers on the
   channel alone): `RelayListener.reach`.
3. Each side waits for the other's words while the other's process beats (`heard`: its
   heartbeat checked every `PEER_CHECK_S`), so a dead peer keeps nobody waiting.
4. The subscription is closed whatever happened (`aclose`, idempotent).

Only a live process other than this one is an owner to relay to (`other_live_owner`): one
that is this process, no process, or one whose heartbeat has gone means what a single worker
would say (nothing has it).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sessions.keys import NAMESPACE
from sessions.process_beat import ProcessBeat, Request

PEER_CHECK_S = 1.0
"""How often a side, while it waits for the other's words, checks that the other still beats."""

FindOwner = Callable[[str], Awaitable[str | None]]
"""A target (a session id, a call id) -> the process that holds it, if any says so (the
session's ownership record, the call index)."""


def new_relay_id() -> str:
    return secrets.token_hex(8)


def relay_channel(kind: str, relay_id: str, namespace: str = NAMESPACE) -> str:
    """The pub/sub channel of one relay of `kind` ("request-relay", "sideband-relay")."""
    return f"{namespace}:{kind}:{relay_id}"


async def other_live_owner(beat: ProcessBeat, owner: str | None) -> str | None:
    """`owner` when it is another process and it beats; None when nothing elsewhere has it."""
    if owner is None or owner == beat.process_id or not await beat.alive(owner):
        return None
    return owner


async def next_message(pubsub: Any, within_s: float) -> str | None:
    """The next message on a subscribed channel, or None after `within_s`."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            while True:
                message = await pubsub.get_message(timeout=within_s)
                if message is not None and message.get("type") == "message":
                    raw = message["data"]
                    return raw.decode() if isinstance(raw, bytes) else str(raw)
    return None


class RelayListener:
    """One side's subscription to the channel the other side (the `peer` process) speaks on.

    Redis errors (RedisError, OSError) reach the caller, which knows what a lost relay means
    for what it carries; `aclose` alone swallows them."""

    def __init__(self, redis: aioredis.Redis, beat: ProcessBeat, peer: str) -> None:
        self._beat = beat
        self.peer = peer
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)
        self._checked = asyncio.get_running_loop().time()

    async def __aenter__(self) -> RelayListener:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def subscribe(self, channel: str) -> None:
        await self._pubsub.subscribe(channel)

    async def reach(self, channel: str, request: Request, ask_s: float | None = None) -> bool:
        """The taker's start: listen on `channel`, then hand `request` to the peer's mailbox,
        asked (waiting up to `ask_s` for the mailbox's answer) or, with no `ask_s`, told.
        False when the mailbox did not answer in time, or nobody listens on it."""
        await self.subscribe(channel)
        if ask_s is None:
            return await self._beat.tell(self.peer, request)
        return await self._beat.ask(self.peer, request, ask_s)

    async def next(self, within_s: float) -> str | None:
        """The next word within `within_s` (a reply the peer gives at once); None when none."""
        return await next_message(self._pubsub, within_s)

    async def heard(self) -> str | None:
        """The next word, however long it takes while the peer beats; None once it has gone.
        Its heartbeat is checked every `PEER_CHECK_S`, words or not: a stream of them does
        not hide a peer taken for dead."""
        loop = asyncio.get_running_loop()
        silent = False
        while True:
            if silent or loop.time() - self._checked >= PEER_CHECK_S:
                self._checked = loop.time()
                if not await self._beat.alive(self.peer):
                    return None
            word = await next_message(self._pubsub, PEER_CHECK_S)
            if word is not None:
                return word
            silent = True

    async def aclose(self) -> None:
        """Leave the channel. Idempotent; a Redis that cannot be reached is not an error."""
        with contextlib.suppress(RedisError, OSError):
            await self._pubsub.aclose()
