"""Stored GPT-Live sessions: what a session with `store: true` leaves when it ends.

GPT-Live keeps a stored session for forking (`/v1/live/sessions/{id}/fork`) and for its
recording (`GET /v1/live/sessions/{id}/content`). Parley keeps it in Redis, where session
state already lives, so any worker process can fork or serve it: one hash a session,
`parley:{<session id>}:live_stored`, written once as the session ends and expiring after
the retention (`--live-store-retention-s`, 24 h by default). Its fields:

- `config`: the session's GPT-Live configuration as it was served (JSON; its `input` left
  out, since that history is in `history`);
- `history`: the conversation as it stood at the end, text only (JSON list of
  `{role, text}`, at most `MAX_ITEMS`, the latest kept): what a fork begins with;
- `recording`: both sides' audio (live_recording.py), raw interleaved PCM16.

Nothing is kept for a session without `store: true` (GPT-Live's default is false). A
Redis outage at the end loses that session's record (logged), never the live call.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sessions.events import ConversationItem
from sessions.keys import NAMESPACE

from .live_config import LiveSessionConfig
from .live_recording import DEFAULT_MAX_S, LiveRecording

log = logging.getLogger("parley.realtime.live")

DEFAULT_RETENTION_S = 24 * 3600
MAX_ITEMS = 128
"""History items kept (GPT-Live's own bound on a session's `input`)."""
CALL_TIMEOUT_S = 10.0
"""A deadline on each Redis call (a recording is up to tens of MB)."""

Role = Literal["developer", "user", "assistant"]


def stored_key(session_id: str, namespace: str = NAMESPACE) -> str:
    """The stored session's hash (hash tag: the session id, as its live keys)."""
    return f"{namespace}:{{{session_id}}}:live_stored"


@dataclass(frozen=True, slots=True)
class StoredSession:
    session_id: str
    live: LiveSessionConfig
    history: list[tuple[Role, str]]


def history_of(items: list[ConversationItem]) -> list[tuple[Role, str]]:
    """The messages with text, in GPT-Live's roles (a system note is `developer`)."""
    kept: list[tuple[Role, str]] = []
    for item in items:
        if item.type != "message" or not item.text.strip():
            continue
        role: Role = "developer" if item.role == "system" else item.role
        kept.append((role, item.text))
    return kept[-MAX_ITEMS:]


class StoredSessions:
    """This deployment's stored GPT-Live sessions, in Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        retention_s: int = DEFAULT_RETENTION_S,
        recording_max_s: float = DEFAULT_MAX_S,
        namespace: str = NAMESPACE,
    ) -> None:
        self.redis = redis
        self.retention_s = retention_s
        self.recording_max_s = recording_max_s
        self.namespace = namespace

    def recorder(self) -> LiveRecording:
        return LiveRecording(self.recording_max_s)

    async def save(
        self,
        session_id: str,
        live: LiveSessionConfig,
        items: list[ConversationItem],
        recording: LiveRecording | None,
    ) -> None:
        """Keep an ended session (one transaction, bounded by CALL_TIMEOUT_S; a server
        stopped meanwhile cancels it, and the session is not kept)."""
        config = live.model_dump_json(exclude_none=True, exclude={"input"})
        history = json.dumps([{"role": r, "text": t} for r, t in history_of(items)])
        fields: dict[str, Any] = {"config": config, "history": history}
        # Tens of MB to lay out at the cap: off the event loop, which carries live media.
        fields["recording"] = b"" if recording is None else await asyncio.to_thread(recording.pcm)
        key = stored_key(session_id, self.namespace)
        try:
            await self._write(key, fields)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("session %s: not stored: %s", session_id, exc)
            return
        log.info("session %s stored for %d s", session_id, self.retention_s)

    async def _write(self, key: str, fields: dict[str, Any]) -> None:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self.retention_s)
                await pipe.execute()

    async def load(self, session_id: str) -> StoredSession | None:
        """The stored session (None: unknown or expired)."""
        async with asyncio.timeout(CALL_TIMEOUT_S):
            config, history = await self.redis.hmget(
                stored_key(session_id, self.namespace), ["config", "history"]
            )
        if config is None or history is None:
            return None
        live = LiveSessionConfig.model_validate_json(config)
        items = [(entry["role"], entry["text"]) for entry in json.loads(history)]
        return StoredSession(session_id, live, items)

    async def recording(self, session_id: str) -> bytes | None:
        """The raw recording (interleaved stereo PCM16), None when nothing is stored."""
        async with asyncio.timeout(CALL_TIMEOUT_S):
            found = await self.redis.hget(stored_key(session_id, self.namespace), "recording")
        return None if found is None else bytes(found)
