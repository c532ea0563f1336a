"""Admission: whether a new session may start here, counted across every process.

A session takes a slot of the service-wide cap (`LeaseRegistry`: its lease in Redis) and,
when it starts on behalf of a caller (an API key or an address), a slot of that caller's
own limit (`KeyLimiter`), so that one caller cannot take every slot. Both live in Redis,
so both are refused while Redis cannot count them: unreachable, or full and refusing
writes (`maxmemory`, `noeviction`). Each refusal is a `SessionLimitError` (or its
`KeyLimitError`) whose words a client can act on, and is counted in the session metrics.

The manager (manager.py) holds one of these; it renews and frees the slots with the
sessions' leases.
"""

from __future__ import annotations

import contextlib
import logging

from redis.exceptions import RedisError

from .errors import KeyLimitError, RedisFullError, RedisUnavailableError, SessionLimitError
from .key_limits import KeyLimiter
from .leases import LeaseRegistry
from .metrics import SessionMetrics
from .redis_link import RedisLink

log = logging.getLogger("parley.sessions.admission")

FULL = (
    "the session store (Redis) is full (out of memory) and refuses writes, so no new "
    "session can be stored; try again shortly"
)
UNREACHABLE = (
    "the session store (Redis) is unreachable, so no new session can be counted; try again shortly"
)


class Admission:
    def __init__(
        self,
        link: RedisLink,
        leases: LeaseRegistry,
        key_limits: KeyLimiter,
        metrics: SessionMetrics,
    ) -> None:
        self.link, self.leases, self.key_limits, self.metrics = link, leases, key_limits, metrics

    def counts(self, caller: str | None) -> bool:
        """Whether `caller`'s sessions count against a limit of its own."""
        return caller is not None and self.key_limits.limits.enabled

    async def admit(self, session_id: str, caller: str | None) -> None:
        """Take the new session's slot of the cap, and of `caller`'s limit; raises
        SessionLimitError (KeyLimitError for the caller's) and takes nothing when refused."""
        if self.link.up and self.link.refusing:
            self.metrics.session_limit_rejections.inc()
            raise SessionLimitError(FULL)
        try:
            admitted = await self.link.call(lambda: self.leases.acquire(session_id))
        except RedisUnavailableError as exc:
            self.metrics.session_limit_rejections.inc()
            if isinstance(exc, RedisFullError):
                raise SessionLimitError(FULL) from None
            raise SessionLimitError(UNREACHABLE) from None
        if not admitted:
            self.metrics.session_limit_rejections.inc()
            raise SessionLimitError(
                f"all {self.leases.cap} session slots are in use; try again shortly"
            )
        if caller is not None and self.counts(caller):
            await self._count_against(caller, session_id)

    async def release_quietly(self, session_id: str) -> None:
        """Give the slot back now if Redis takes it; else it lapses at its TTL."""
        with contextlib.suppress(RedisError, OSError):
            await self.link.call(lambda: self.leases.release(session_id))

    async def check_caller(self, caller: str) -> None:
        """KeyLimitError if `caller` could not start a session now. It takes nothing (a
        refusal before a WebSocket upgrade; `admit` decides for good), and says nothing
        when Redis cannot answer (`admit` will)."""
        if not self.key_limits.limits.enabled:
            return
        try:
            await self.link.call(lambda: self.key_limits.check(caller))
        except KeyLimitError as exc:
            self.metrics.key_limit_rejections.inc()
            log.warning("caller %s refused a session: %s", caller, exc)
            raise
        except (RedisError, OSError):
            pass

    async def _count_against(self, caller: str, session_id: str) -> None:
        """Take a slot of `caller`'s for a session that has just taken its lease; the lease
        goes back if the caller is at its limit (KeyLimitError) or Redis is unreachable."""
        try:
            await self.link.call(lambda: self.key_limits.acquire(caller, session_id))
        except (KeyLimitError, RedisUnavailableError) as exc:
            await self.release_quietly(session_id)
            if isinstance(exc, KeyLimitError):
                self.metrics.key_limit_rejections.inc()
                log.warning("caller %s refused a session: %s", caller, exc)
                raise
            self.metrics.session_limit_rejections.inc()
            raise SessionLimitError(UNREACHABLE) from None
