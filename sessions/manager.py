"""The sessions of one server process: admission, lookup, upkeep and shutdown.

The manager owns each session's task (it starts `Session.run()` and awaits it on close),
an upkeep task that renews leases and key expiries, and the process's watch on Redis (the
link's heartbeat/probe and the reaction to an outage). These tasks outlive the calls that
start them (`create`, `__aenter__`), so no TaskGroup can hold them (it would have to span
`__aenter__` and `__aexit__`, or a server's whole life): the manager keeps them and ends
them with `cancel_and_wait`. Admission goes through `LeaseRegistry`, so the session cap
holds across every process sharing the Redis.

A Redis outage: every live session's client is told once; sessions go on with their writes
kept locally; new sessions are refused (the cap cannot be checked). When Redis answers
again, every live session takes its lease again (a restarted Redis has none), rewrites what
a restart lost, and writes back what it kept, at once rather than at the next upkeep tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pipeline.tasks import cancel_all, cancel_and_wait
from pipeline.types import Pipeline

from .clock import REAL_CLOCK, Clock
from .config import SessionConfig
from .errors import RedisUnavailableError, SessionLimitError, SessionNotFoundError
from .events import new_id
from .keys import SessionKeys
from .leases import LeaseRegistry
from .metrics import SessionMetrics
from .redis_link import RedisLink
from .session import Session, SessionLimits
from .sink import OutputSink

log = logging.getLogger("parley.sessions.manager")

DEFAULT_MAX_SESSIONS = 64
SHUTDOWN_TIMEOUT_S = 5.0


class SessionManager:
    def __init__(
        self,
        redis: aioredis.Redis,
        pipeline: Pipeline,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        limits: SessionLimits | None = None,
        lease_ttl_s: float = 30.0,
        metrics: SessionMetrics | None = None,
        link: RedisLink | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        """`clock`: the time its sessions live by (tests compress it); the upkeep that
        renews leases and key expiries stays on wall time, as Redis expires them in its own."""
        self.redis = redis
        self.clock = clock
        self.link = link or RedisLink(redis)
        self.pipeline = pipeline
        self.limits = limits or SessionLimits()
        self.metrics = metrics or SessionMetrics()
        self.leases = LeaseRegistry(redis, max_sessions, ttl_s=lease_ttl_s)
        self._sessions: dict[str, Session] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._background: list[asyncio.Task[None]] = []
        self._unreleased: set[str] = set()
        """Sessions that closed during an outage: their lease and keys go when Redis is back
        (rather than at their TTLs)."""
        self._accepting = True

    @property
    def max_sessions(self) -> int:
        return self.leases.cap

    async def __aenter__(self) -> SessionManager:
        self._background = [
            asyncio.create_task(self._upkeep_loop(), name="sessions:upkeep"),
            asyncio.create_task(self.link.run(), name="sessions:redis-link"),
            asyncio.create_task(self._watch_redis(), name="sessions:redis-outages"),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(
        self,
        sink: OutputSink,
        config: SessionConfig | Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Admit and start a session; raises SessionLimitError at the cap, ConfigError on
        bad settings."""
        if not self._accepting:
            raise SessionLimitError("the server is shutting down")
        if not isinstance(config, SessionConfig):
            config = SessionConfig.parse(config)
        session_id = session_id or new_id("sess")
        try:
            admitted = await self.link.call(lambda: self.leases.acquire(session_id))
        except RedisUnavailableError:
            self.metrics.session_limit_rejections.inc()
            raise SessionLimitError(
                "the session store (Redis) is unreachable, so no new session can be counted; "
                "try again shortly"
            ) from None
        if not admitted:
            self.metrics.session_limit_rejections.inc()
            raise SessionLimitError(
                f"all {self.leases.cap} session slots are in use; try again shortly"
            )
        session = Session(
            session_id=session_id,
            config=config,
            redis=self.redis,
            pipeline=self.pipeline,
            sink=sink,
            limits=self.limits,
            metrics=self.metrics,
            link=self.link,
            clock=self.clock,
        )
        self._sessions[session_id] = session
        self.metrics.active_sessions.inc()
        self._tasks[session_id] = asyncio.create_task(self._own(session), name=session_id)
        return session

    async def _own(self, session: Session) -> None:
        """The session's task: runs it, then frees its slot whatever happened."""
        try:
            await session.run()
        except Exception:
            log.exception("session %s ended with an error", session.session_id)
        finally:
            self._sessions.pop(session.session_id, None)
            self.metrics.active_sessions.dec()
            try:
                await self.link.call(lambda: self.leases.release(session.session_id))
            except (RedisError, OSError):  # RedisUnavailableError is an OSError
                self._unreleased.add(session.session_id)
            log.info("session %s closed (%s)", session.session_id, session.close_reason)

    def get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFoundError(f"no live session {session_id}") from None

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def close_session(self, session_id: str, reason: str = "client") -> None:
        """Close one session and wait for its teardown. Idempotent."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.request_close(reason)
        task = self._tasks.get(session_id)
        if task is not None:  # not cancelled: the session ends itself, goodbye included
            await asyncio.wait({task})
            self._tasks.pop(session_id, None)

    async def close(self, reason: str = "server_shutdown") -> None:
        """Stop admitting, say goodbye to every session, end them all. Idempotent."""
        self._accepting = False
        for session in list(self._sessions.values()):
            session.request_close(reason)
        tasks = list(self._tasks.values())
        if tasks:  # each session says goodbye and tears down; past the timeout it is cut
            _, slow = await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT_S)
            await cancel_all(slow)
        self._tasks.clear()
        background, self._background = self._background, []
        await cancel_and_wait(*background)

    async def _upkeep_loop(self) -> None:
        interval = max(0.5, self.leases.ttl_s / 3)
        while True:
            await asyncio.sleep(interval)
            for task_id in [sid for sid, t in self._tasks.items() if t.done()]:
                self._tasks.pop(task_id, None)
            if not self.link.up:
                continue  # the outage watch renews everything when Redis is back
            for session in list(self._sessions.values()):
                try:
                    await self._renew(session)
                except RedisUnavailableError:
                    self.metrics.redis_errors.inc()
                    break  # logged once by the link; the outage watch takes over
                except RedisError as exc:
                    self.metrics.redis_errors.inc()
                    log.warning("lease renewal failed: %s", exc)

    async def _renew(self, session: Session) -> None:
        if not await self.link.call(lambda: self.leases.renew(session.session_id)):
            log.warning(
                "session %s lost its lease and the cap is full; it goes on uncounted",
                session.session_id,
            )
        await session.store.refresh_keys()

    async def _watch_redis(self) -> None:
        """Tell every session of an outage once; put everything back when Redis returns."""
        outage = 0
        while True:
            outage = await self.link.next_outage(outage)
            self.metrics.redis_outages.inc()
            self.metrics.redis_up.set(0)
            for session in list(self._sessions.values()):
                session.redis_unavailable(outage)
            await self.link.wait_up()
            try:
                restored = await self._restore()
            except RedisUnavailableError:
                continue  # down again: the next outage is reported and restored in turn
            except RedisError as exc:
                log.error("Redis is back but restoring the sessions failed: %s", exc)
                continue
            finally:
                self.metrics.redis_up.set(1 if self.link.up else 0)
            log.info(
                "Redis is back %s; %d live sessions restored (leases, records, spilled writes)",
                self.link.summary(),
                restored,
            )

    async def _restore(self) -> int:
        """After an outage: leases taken again, records rewritten, spills written back."""
        if self._unreleased:
            gone = list(self._unreleased)
            keys = [key for sid in gone for key in SessionKeys(sid).all()]

            async def forget() -> None:
                pipe = self.redis.pipeline(transaction=False)
                pipe.zrem(self.leases.key, *gone)
                pipe.delete(*keys)
                await pipe.execute()

            await self.link.call(forget)
            self._unreleased.difference_update(gone)
        sessions = list(self._sessions.values())
        for session in sessions:
            await self._renew(session)
            await session.restore_after_outage()
        return len(sessions)
