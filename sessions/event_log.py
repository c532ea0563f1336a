"""A bounded per-session log of emitted events, for replay after a dropped connection.

Recording never blocks the session: events go into a bounded queue that a writer task
(owned by the session) flushes to a Redis stream in batches, through the session's spill:
while Redis is unreachable the batches are kept locally (bounded, oldest dropped and
counted) and written back in order when it answers, so the resume log has no gap. If the
writer falls behind, the queue drops its oldest entries and counts them; the live call
goes on. Droppable events (audio deltas) are not logged: replaying stale audio after a
reconnect would play speech that is no longer current, and the items and transcripts say
what was said.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from .events import Event
from .keys import DEFAULT_KEY_TTL_S, SessionKeys
from .records import event_to_dict
from .redis_link import RedisLink
from .spill import Spill

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
        spill: Spill | None = None,
    ) -> None:
        self._spill = spill if spill is not None else Spill(RedisLink(redis))
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
                except RedisError as exc:  # not an outage (the spill keeps those): a bug
                    self.redis_errors += 1
                    self.dropped += len(batch)
                    log.error("event log write refused, %d events lost: %s", len(batch), exc)
            self._idle.set()

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        key, cap, ttl = self._key, self.max_events, self._ttl_s
        lines = [json.dumps(body, separators=(",", ":")) for body in batch]

        def apply(pipe: Pipeline) -> None:
            for body, line in zip(batch, lines, strict=True):
                pipe.xadd(key, {"id": body["event_id"], "e": line}, maxlen=cap, approximate=True)
            pipe.expire(key, ttl)

        await self._spill.write("events", apply, size=sum(map(len, lines)), values=batch)

    async def flushed(self) -> None:
        """Wait until everything recorded so far is in Redis (or counted as lost).

        Raises RedisUnavailableError while Redis is unreachable and events wait locally."""
        await self._idle.wait()
        await self._spill.settle()
        if self._spill.holds("events"):
            raise self._spill.link.unavailable()

    async def replay(self, after_event_id: str | None = None) -> list[dict[str, Any]]:
        """Logged events in order; with an id, only those after that event.

        Raises KeyError if `after_event_id` is no longer in the log (it was trimmed), so
        the caller can tell a client that a gap-free resume is impossible, and
        RedisUnavailableError while Redis is unreachable.
        """
        link = self._spill.link
        entries = await link.call(lambda: link.redis.xrange(self._key))
        events, seen = [], set()
        for _, fields in entries:
            body = json.loads(fields[b"e"])
            if body["event_id"] not in seen:  # a write back cut off mid-way is sent again
                seen.add(body["event_id"])
                events.append(body)
        if after_event_id is None:
            return events
        for index, body in enumerate(events):
            if body["event_id"] == after_event_id:
                return events[index + 1 :]
        raise KeyError(after_event_id)
