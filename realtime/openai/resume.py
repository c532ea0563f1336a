"""What a reconnecting client missed: the event log after its last event, as wire messages.

The log holds the session's own events (`sessions.records.event_to_dict`), not wire JSON.
We rebuild each event and run the *whole* log through the connection's fresh message
mapping (for an OpenAI client, its GAExpander): the mapping's state (the response in
progress, its text so far) must be what it was live, and its ids are deterministic, so
the replay carries exactly the ids the client would have seen. Everything after the
client's `last_event_id` is missed.

`last_event_id` may be any id the client received: a logged event (`evt_…`), an event
the expander added (`evt_….2`), or an audio delta (`<last event id>~<n>`, named after the
event sent just before it). Audio is never replayed: it is stale by now, and the items
and transcripts say what was said.

Both WebSocket protocols replay this way, each through its own message mapping
(`MessageConnection.messages`, connection.py): `replay_messages` is the part they share.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from sessions import EventLog, event_from_dict
from sessions.events import Event

from .ga_events import source_id

log = logging.getLogger("parley.realtime.websocket.resume")

Message = dict[str, Any]

REPLAY_TIMEOUT_S = 5.0
"""How long reading the missed events from the log may take."""
HELD_EVENTS = 1_024
"""Live events held while the missed ones are read from the log (milliseconds' worth)."""


@dataclass(slots=True)
class Replay:
    missed: list[Message] = field(default_factory=list)
    """What to send, in order; everything logged when `found` is False."""
    found: bool = False
    """Whether `last_event_id` was in the log (False: trimmed, or not ours)."""
    logged_ids: set[str] = field(default_factory=set)
    """Ids of the session events the replay covered (live copies of these are skipped)."""


async def read_log(event_log: EventLog, session_id: str) -> list[dict[str, Any]] | None:
    """Every event logged so far, the pending writes included; None when the log cannot
    be read (Redis down or slow)."""
    try:
        async with asyncio.timeout(REPLAY_TIMEOUT_S):
            await event_log.flushed()
            return await event_log.replay()
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("session %s: event log unreadable: %s", session_id, exc)
        return None


def replay_messages(
    bodies: list[dict[str, Any]],
    expand: Callable[[Event], list[Message]],
    last_event_id: str | None,
) -> Replay:
    """The messages after `last_event_id` (all of them when None): every logged event goes
    through `expand` (a connection's own, fresh mapper, so its state ends up as it was
    live), and what follows the message the client saw last is missed.

    Message ids are the logged event's id for the first message of its group and
    `<id>.<n>` for the others; a client's `<id>~<n>` names a message sent after `<id>`
    that no event produced (audio, a pong), so the replay starts right after `<id>`."""
    anchor = last_event_id.split("~", 1)[0] if last_event_id else None
    source = source_id(anchor) if anchor else None
    replay = Replay(found=anchor is None)
    everything: list[Message] = []
    for body in bodies:
        try:
            event = event_from_dict(body)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("event log entry %r skipped: %s", body.get("type"), exc)
            continue
        replay.logged_ids.add(event.event_id)
        group = expand(event)
        if not group:
            continue
        everything.extend(group)
        if replay.found:
            replay.missed.extend(group)
        elif event.event_id == source:
            replay.found = True
            ids = [message["event_id"] for message in group]
            if anchor in ids:
                replay.missed.extend(group[ids.index(anchor) + 1 :])
    if not replay.found:
        replay.missed = everything
    return replay
