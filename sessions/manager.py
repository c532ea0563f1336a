"""The sessions of one server process: admission, lookup, upkeep and shutdown.

The manager owns each session's task (it starts `Session.run()` and awaits it on close)
and one upkeep task that renews leases and key expiries. Admission goes through
`LeaseRegistry`, so the session cap holds across every process sharing the Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pipeline.types import Pipeline

from .config import SessionConfig
from .errors import SessionLimitError, SessionNotFoundError
from .events import new_id
from .leases import LeaseRegistry
from .metrics import SessionMetrics
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
    ) -> None:
        self.redis = redis
        self.pipeline = pipeline
        self.limits = limits or SessionLimits()
        self.metrics = metrics or SessionMetrics()
        self.leases = LeaseRegistry(redis, max_sessions, ttl_s=lease_ttl_s)
        self._sessions: dict[str, Session] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._upkeep: asyncio.Task[None] | None = None
        self._accepting = True

    @property
    def max_sessions(self) -> int:
        return self.leases.cap

    async def __aenter__(self) -> SessionManager:
        self._upkeep = asyncio.create_task(self._upkeep_loop(), name="sessions:upkeep")
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
        if not await self.leases.acquire(session_id):
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
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await asyncio.wait_for(self.leases.release(session.session_id), 2.0)
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
        if task is not None:
            await asyncio.wait({task})
            self._tasks.pop(session_id, None)

    async def close(self, reason: str = "server_shutdown") -> None:
        """Stop admitting, say goodbye to every session, end them all. Idempotent."""
        self._accepting = False
        for session in list(self._sessions.values()):
            session.request_close(reason)
        tasks = list(self._tasks.values())
        if tasks:
            _, slow = await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT_S)
            for task in slow:
                task.cancel()
            if slow:
                await asyncio.wait(slow)
        self._tasks.clear()
        if self._upkeep is not None:
            self._upkeep.cancel()
            await asyncio.wait({self._upkeep})
            self._upkeep = None

    async def _upkeep_loop(self) -> None:
        interval = max(0.5, self.leases.ttl_s / 3)
        while True:
            await asyncio.sleep(interval)
            for task_id in [sid for sid, t in self._tasks.items() if t.done()]:
                self._tasks.pop(task_id, None)
            for session in list(self._sessions.values()):
                try:
                    if not await self.leases.renew(session.session_id):
                        log.warning(
                            "session %s lost its lease and the cap is full; it goes on uncounted",
                            session.session_id,
                        )
                    await session.refresh_keys()
                except (RedisError, OSError, TimeoutError) as exc:
                    self.metrics.redis_errors.inc()
                    log.warning("lease renewal failed: %s", exc)
