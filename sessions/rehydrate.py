"""A session built again from Redis, in a process that did not create it.

What a resume elsewhere needs is in the session's keys: the record (`meta`: config,
resume token, the transport's state, owner and fence), the history (items in order), the
input audio (its last frame says where the audio timeline goes on), and the event log
(the resume replay reads it as it is; its ids were made when the events were, so they are
the same in every process). What is not carried over: the audio of a turn in progress
that no commit holds yet (the new timeline starts where the stored audio ends: speech cut
by the move is dropped, and the next turn starts fresh), the turn detector's state, and
the session's age (its lifetime starts again here).

An answer that was in progress (its `response.created` logged, no `response.done`) is
ended by the new owner as cancelled, with the text the client got so far: its item is
committed with that text (status incomplete), and `response.done` says so, so the client
sees the same answer end that a cancel would have given it.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from pipeline.audio_format import FRAME_MS

from .audio_buffer import frames_in_entry
from .config import SessionConfig
from .events import (
    ConversationItem,
    ConversationItemCreated,
    Event,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
)
from .history import History
from .keys import SessionKeys
from .records import event_from_dict

log = logging.getLogger("parley.sessions.rehydrate")

MOVED_REASON = "session_moved"
"""Why an answer cut off by a move ended (response.done's reason)."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    config: SessionConfig
    resume_token: str
    transport: dict[str, Any] = field(default_factory=dict)
    owner: str = ""
    fence: int = 0

    def matches(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.resume_token.encode())


async def read_record(redis: aioredis.Redis, session_id: str) -> SessionRecord | None:
    """The session's record; None when there is none (it ended, expired, or its record
    was never written)."""
    raw = await redis.hgetall(SessionKeys(session_id).meta)
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    if "config" not in fields or "resume_token" not in fields:
        return None
    try:
        config = SessionConfig.model_validate_json(fields["config"])
        transport = json.loads(fields.get("transport", "{}"))
    except ValueError as exc:
        log.warning("session %s: unreadable record: %s", session_id, exc)
        return None
    return SessionRecord(
        session_id,
        config,
        fields["resume_token"],
        transport if isinstance(transport, dict) else {},
        fields.get("owner", ""),
        int(fields.get("fence", "0") or 0),
    )


async def audio_end_ms(redis: aioredis.Redis, session_id: str) -> int:
    """Where the stored input audio ends on the session's timeline (0: none stored)."""
    last = await redis.xrevrange(SessionKeys(session_id).audio, count=1)
    if not last:
        return 0
    entry_id, fields = last[0]
    return int(entry_id.split(b"-", 1)[0]) + frames_in_entry(fields[b"pcm"]) * FRAME_MS


def unfinished_answer(bodies: list[dict[str, Any]]) -> ResponseDone | None:
    """The end of the answer the log shows in progress (created, never done), as a
    cancelled `response.done` with the text sent so far; None when every answer ended."""
    created: ResponseCreated | None = None
    item: ConversationItem | None = None
    text: list[str] = []
    for body in bodies:
        try:
            event = event_from_dict(body)
        except (KeyError, TypeError, ValueError):
            continue
        match event:
            case ResponseCreated():
                created, item, text = event, None, []
            case ResponseDone() if created is not None and event.response_id == created.response_id:
                created = None
            case ConversationItemCreated(item=new) if (
                created is not None
                and event.response_id == created.response_id
                and new.type == "message"
            ):
                item = new
            case OutputAudioTranscriptDelta() | OutputTextDelta() if (
                created is not None and event.response_id == created.response_id
            ):
                text.append(event.delta)
    if created is None:
        return None
    if item is not None:
        item = dataclasses.replace(item, status="incomplete", text="".join(text).strip())
    return ResponseDone(
        response_id=created.response_id,
        status="cancelled",
        reason=MOVED_REASON,
        item=item,
        metadata=created.metadata,
        in_conversation=created.in_conversation,
        audio_output=created.audio_output,
        max_output_tokens=created.max_output_tokens,
    )


async def end_unfinished(history: History, bodies: list[dict[str, Any]]) -> list[Event]:
    """The events that end an answer left in progress (none if there is none); its item
    joins the history with the text the client got."""
    done = unfinished_answer(bodies)
    if done is None:
        return []
    item = done.item
    if item is not None and done.in_conversation and item.text and item.id not in history:
        await history.append(item)
    return [done]
