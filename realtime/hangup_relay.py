"""Hang-ups across worker processes: a hang-up lands on any worker, its session may not.

With `parley serve --workers N` the kernel gives an HTTP request to any worker, and the
session or call a hang-up names (GPT-Live's `POST /v1/live/sessions/{id}/hangup`, OpenAI
Realtime's `POST /v1/realtime/calls/{id}/hangup`) may live in another: its owner, found
as a sideband finds it (the session's ownership record, the call index). A call cannot
move, and the app is told the hang-up worked only once something ended, so the worker that
took the request (the taker) asks the owner to end it there, the same way a sideband is
relayed (sideband_relay.py), and answers with what the owner says:

1. The taker subscribes to a fresh answer channel (pub/sub: no keys are left behind), then
   asks the owner through its mailbox (process_beat.py) to hang up (`OP`, naming the
   protocol, the target and the channel).
2. The owner ends the target exactly as a local hang-up does (the protocol's `HangUp`), then
   publishes `ended` on the channel, or `missing` when it has no such target (an index key
   or an owner field that outlived its call or session). Its mailbox answers once that is
   done, so the taker reads the word at once after the answer (`SAID_S`).
3. The taker gives up after `ANSWER_S` (`UNANSWERED`): the owner is silent, or too slow to
   end it. A target whose owner is this process, no process, or one whose heartbeat has
   gone is `MISSING`, as it would be with one worker.

Nothing waits unbounded: the whole relay runs within `ANSWER_S`, and the owner's side runs
in the mailbox's own task for the request (no task of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sessions.keys import NAMESPACE
from sessions.process_beat import ProcessBeat, Request

from .sideband_relay import next_message

log = logging.getLogger("parley.realtime.hangup_relay")

OP = "hangup_relay"
ENDED, MISSING = "ended", "missing"
ANSWER_S = 5.0
"""How long the taker waits for the owner to say it ended the target (a WebRTC call's close
takes well under a second)."""
SAID_S = 1.0
"""How long the taker waits for the owner's word once its mailbox answered (the word went
out first: only a hang-up that failed, and was logged there, leaves none)."""

HangUp = Callable[[str], Awaitable[bool]]
"""End a protocol's target (a session id, a call id) here as a local hang-up does; False
when this process has no such target."""
FindOwner = Callable[[str], Awaitable[str | None]]
"""A target -> the process that holds it, if any says so (Ownership.owner, CallIndex.owner)."""


class Outcome(enum.Enum):
    ENDED = "ended"
    """The owner ended it."""
    MISSING = "missing"
    """No process has it: the route's 404."""
    UNANSWERED = "unanswered"
    """The owner did not say within `ANSWER_S` (or Redis could not be reached): whether it
    ended is unknown."""


def answer_channel(relay_id: str, namespace: str = NAMESPACE) -> str:
    return f"{namespace}:hangup-relay:{relay_id}"


class HangupRelays:
    """The owner's side for every protocol: ends what other workers' hang-ups name."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._hang_ups: dict[str, HangUp] = {}

    def serve(self, protocol: str, hang_up: HangUp) -> None:
        """End relayed hang-ups of `protocol` with `hang_up`."""
        self._hang_ups[protocol] = hang_up

    async def on_request(self, request: Request) -> None:
        """Another worker asks to hang up something here (`OP`); runs in the mailbox's task
        for the request, whose answer goes out after this returns."""
        relay_id = str(request.get("relay", ""))
        if not relay_id:
            return
        hang_up = self._hang_ups.get(str(request.get("protocol")))
        ended = hang_up is not None and await hang_up(str(request.get("target")))
        await self._redis.publish(answer_channel(relay_id), ENDED if ended else MISSING)


async def relay_hangup(
    redis: aioredis.Redis, beat: ProcessBeat, find_owner: FindOwner, protocol: str, target: str
) -> Outcome:
    """The taker's side: have the process that holds `target` (`find_owner`) hang it up,
    within `ANSWER_S`."""
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    try:
        async with asyncio.timeout(ANSWER_S):
            owner = await find_owner(target)
            if owner is None or owner == beat.process_id or not await beat.alive(owner):
                return Outcome.MISSING
            relay_id = secrets.token_hex(8)
            await pubsub.subscribe(answer_channel(relay_id))
            request = {"op": OP, "protocol": protocol, "target": target, "relay": relay_id}
            if await beat.ask(owner, request, ANSWER_S):
                said = await next_message(pubsub, SAID_S)
                if said in (ENDED, MISSING):
                    return Outcome(said)
    except TimeoutError:
        pass
    except (RedisError, OSError) as exc:
        log.warning("hang-up of %s %s not relayed: %s", protocol, target, exc)
    finally:
        with contextlib.suppress(RedisError, OSError):
            await pubsub.aclose()
    return Outcome.UNANSWERED
