"""What a session keeps in Redis: its record, its buffers and event log, and their keys.

Every write goes through the session's spill, so an outage never stops a call: what cannot
be written now is kept and written back in order when Redis answers (spill.py). The store
also puts back what an empty restart lost (the record and the history), pushes the keys'
expiries out while the session lives, and deletes the keys when it ends, fenced: only while
this process still owns the session (`fence`, ownership.py), so the late teardown of a
process that lost the session never deletes it under its new owner. The session decides
what to keep; the store decides how it reaches Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline as RedisPipeline

from .audio_buffer import AudioBuffer
from .config import SessionConfig
from .event_log import EventLog
from .frame_cache import FrameCache
from .history import History
from .keys import SessionKeys
from .metrics import SessionMetrics
from .ownership import delete_script
from .redis_link import RedisLink
from .spill import OnDrop, Spill

log = logging.getLogger("parley.sessions.store")

DELETE_TIMEOUT_S = 5.0


class SessionStore:
    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        redis: aioredis.Redis,
        link: RedisLink,
        *,
        ttl_s: int,
        spill_max_bytes: int,
        metrics: SessionMetrics,
        on_drop: OnDrop | None = None,
    ) -> None:
        """`on_drop`: told when the spill gives up kept writes (spill.py)."""
        self.session_id = session_id
        self.keys = SessionKeys(session_id)
        self.link = link
        self.spill = Spill(link, spill_max_bytes, metrics, on_drop)
        spill = self.spill
        self.audio = AudioBuffer(
            redis, self.keys, config.max_audio_seconds, ttl_s, spill=spill, write_behind=True
        )
        self.frames = FrameCache(redis, self.keys, config.video, ttl_s, spill=spill)
        self.history = History(redis, self.keys, ttl_s=ttl_s, spill=spill)
        self.event_log = EventLog(redis, self.keys, ttl_s=ttl_s, spill=spill)
        self._redis = redis
        self._ttl_s = ttl_s
        self.metrics = metrics
        self._created = time.time()
        self.fence = 0
        """This process's fence on the session (ownership.py); 0: unfenced."""
        self.lost = False
        """Another process owns the session now: its keys were left alone."""
        self._delete_script = delete_script(redis)

    async def owns(self) -> bool:
        """Whether this process still holds the session's fence (True when unfenced, or
        when Redis cannot tell: writes then go on as before)."""
        if not self.fence or not self.link.up:
            return True
        try:
            current = await self.link.call(lambda: self._redis.hget(self.keys.meta, "fence"))
        except Exception as exc:
            log.debug("session %s: fence unreadable: %s", self.session_id, exc)
            return True
        return current is None or int(current) == self.fence

    async def write_transport(self, state: dict[str, Any]) -> None:
        """What the transport needs to serve the session elsewhere (the client's audio
        formats, say), kept in the record for a resume on another process."""
        meta, line = self.keys.meta, json.dumps(state, separators=(",", ":"))
        await self.spill.write("record", lambda pipe: pipe.hset(meta, "transport", line))

    async def write_record(self, config: SessionConfig, resume_token: str) -> None:
        """The session record: what another process needs to find and resume it."""
        meta, ttl = self.keys.meta, self._ttl_s
        record = {
            "config": config.model_dump_json(),
            "resume_token": resume_token,
            "created": f"{self._created:.3f}",
        }

        def apply(pipe: RedisPipeline) -> None:
            pipe.hset(meta, mapping=record)
            pipe.expire(meta, ttl)

        await self.spill.write("record", apply)

    async def refresh_keys(self) -> None:
        """Push every key's expiry out again; the manager calls this while the session lives."""

        async def expire_all() -> None:
            pipe = self._redis.pipeline(transaction=False)
            for key in self.keys.all():
                pipe.expire(key, self._ttl_s)
            await pipe.execute()

        await self.link.call(expire_all)

    async def restore(self, config: SessionConfig, resume_token: str) -> None:
        """Redis answers again: put back what a restart lost (the record, the history),
        write back what was kept locally, and push the expiries out. Raises
        RedisUnavailableError if Redis goes away again meanwhile."""
        await self.write_record(config, resume_token)  # small, and a restart lost it
        await self.history.rewrite()  # also undoes a write that reached a stalled server twice
        await self.spill.settle()
        if len(self.spill):  # the write-back stopped: Redis went away again
            raise self.link.unwritable()
        await self.refresh_keys()

    async def write_back(self) -> None:
        """Redis takes writes again (after a refusal: nothing in it was lost, so this is
        all there is to do): write back what was kept locally. Raises
        RedisUnavailableError (RedisFullError) if Redis goes away (or refuses) again."""
        await self.spill.settle()
        if len(self.spill) and not self.link.writable:  # the write back stopped short
            raise self.link.unwritable()

    async def delete(self) -> None:
        """The session has ended: drop what is kept locally and delete the keys. Never
        raises: keys that cannot be deleted now expire by their TTL, or the manager
        removes them when Redis is back."""
        await self.spill.aclose()  # nothing kept is written back after the keys are gone
        if not self.link.up:
            return
        try:
            async with asyncio.timeout(DELETE_TIMEOUT_S):
                await self.link.call(self._delete_keys)
        except Exception as exc:
            self.metrics.redis_errors.inc()
            log.debug("session %s: could not delete keys: %s", self.session_id, exc)

    async def _delete_keys(self) -> None:
        if not self.fence:
            await self._redis.delete(*self.keys.all())
            return
        keys = [self.keys.meta, *(k for k in self.keys.all() if k != self.keys.meta)]
        if not int(await self._delete_script(keys=keys, args=[self.fence])):
            self.lost = True
            log.info("session %s: owned elsewhere now, its keys stay", self.session_id)
