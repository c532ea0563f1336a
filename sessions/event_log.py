"""A bounded per-session log of emitted events, for replay after a dropped connection.

Recording never blocks the session: events go into a bounded queue that a writer task
(owned by the session) flushes to a Redis stream in batches. If Redis is slow or down the
queue drops its oldest entries and counts them; the live call goes on. Droppable events
(audio deltas) are not logged: replaying stale audio after a reconnect would play speech
that is no longer current, and the items and transcripts say what was said.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .events import Event
from .keys import DEFAULT_KEY_TTL_S, SessionKeys
from .records import event_to_dict

log = logging.getLogger("parley.sessions.event_log")

DEFAULT_MAX_EVENTS = 1_000
QUEUE_LIMIT = 1_024
BATCH = 128


class EventLog:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: SessionKeys,
        max_events: int = DEFAULT_MAX_EVENTS,
        ttl_s: int = DEFAULT_KEY_TTL_S,
    ) -> None:
        self._redis = redis
        self._key = keys.events
        self._ttl_s = ttl_s
        self.max_events = max_events
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=QUEUE_LIMIT)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.dropped = 0
        self.redis_errors = 0

    def record(self, event: Event) -> None:
        if event.droppable:
            return
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1  # the deque drops the oldest on append
        self._pending.append(event_to_dict(event))
        self._idle.clear()
        self._wake.set()

    async def run(self) -> None:
        """The writer loop; runs until cancelled by its owner."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
                try:
                    await self._write(batch)
                except RedisError as exc:
                    self.redis_errors += 1
                    self.dropped += len(batch)
                    log.warning("event log write failed, %d events lost: %s", len(batch), exc)
                    await asyncio.sleep(0.5)
            self._idle.set()

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for body in batch:
            pipe.xadd(
                self._key,
                {"id": body["event_id"], "e": json.dumps(body, separators=(",", ":"))},
                maxlen=self.max_events,
                approximate=True,
            )
        pipe.expire(self._key, self._ttl_s)
        await pipe.execute()

    async def flushed(self) -> None:
        """Wait until everything recorded so far is in Redis (or counted as lost)."""
        await self._idle.wait()

    async def replay(self, after_event_id: str | None = None) -> list[dict[str, Any]]:
        """Logged events in order; with an id, only those after that event.

        Raises KeyError if `after_event_id` is no longer in the log (it was trimmed), so
        the caller can tell a client that a gap-free resume is impossible.
        """
        entries = await self._redis.xrange(self._key)
        events = [json.loads(fields[b"e"]) for _, fields in entries]
        if after_event_id is None:
            return events
        for index, body in enumerate(events):
            if body["event_id"] == after_event_id:
                return events[index + 1 :]
        raise KeyError(after_event_id)
