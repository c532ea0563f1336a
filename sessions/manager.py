"""The sessions of one server process: admission, lookup, upkeep and shutdown.

The manager owns each session's task (it starts `Session.run()` and awaits it on close),
an upkeep task that renews leases and key expiries, and the process's watch on Redis (the
link's heartbeat/probe and the reaction to an outage). These tasks outlive the calls that
start them (`create`, `__aenter__`), so no TaskGroup can hold them (it would have to span
`__aenter__` and `__aexit__`, or a server's whole life): the manager keeps them and ends
them with `cancel_and_wait`. Admission goes through `LeaseRegistry`, so the session cap
holds across every process sharing the Redis, and, for a session started on behalf of a
caller (an API key or an address: `create(..., caller=)`), through `KeyLimiter`, so one
caller cannot take every slot (both in admission.py): its sessions' slots are renewed and
freed with their leases.

A Redis outage: every live session's client is told once; sessions go on with their writes
kept locally; new sessions are refused (the cap cannot be checked). When Redis answers
again, every live session takes its lease again (a restarted Redis has none), rewrites what
a restart lost, and writes back what it kept, at once rather than at the next upkeep tick.

A Redis at its memory limit (`maxmemory`, `noeviction`) that refuses writes (`OOM`) is the
same for the writes, not for the reads: every live session's client is told once
(`redis_full`), sessions go on with their writes kept locally, new sessions (and resumes
here) are refused with that reason, since a session that cannot store even its record
could be resumed nowhere. When a probe write is taken again, every session writes back
what it kept.

Any process can take over any session (several processes or hosts on one Redis). Each
manager is a process (`process_id`, `proc_<hex>`) with a heartbeat key and a mailbox
(process_beat.py); each session has an owner and a fence in its record (ownership.py).
The API, for the transports and the server's drain:

- `await manager.resume(session_id, token)`: a session this process does not hold, built
  from Redis (rehydrate.py) and owned here from now on (fence taken over); None when there
  is nothing to resume. The old owner, if its heartbeat says it lives, is asked to let go
  and waited for at most `LET_GO_TIMEOUT_S`; a dead or silent one is not waited for.
- `await manager.hand_over(session_id)`: the session ends here without deleting its keys
  or freeing its lease, and nobody owns it: the next resume anywhere takes it at once.
  Its connection tells the client to reconnect (an `error` `session_moved`, close 1012).
- `await manager.hand_over_all()`: the same for every session a WebSocket serves (those a
  client can resume: `Session.movable`), for a drain; the manager admits nothing more (new
  sessions and resumes go to the other processes). Calls (WebRTC, SIP) are left to end
  at the drain's deadline (`close()`).
A session another process took over ends here silently too (`session_moved`), and a
teardown after losing the fence writes nothing (store.py, session.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pipeline.capacity import PipelineCapacity
from pipeline.tasks import TaskSet, background, cancel_and_wait
from pipeline.types import Pipeline

from .admission import FULL, Admission
from .clock import REAL_CLOCK, Clock
from .config import SessionConfig
from .duplex_turns import DuplexTurns
from .errors import (
    RedisFullError,
    RedisUnavailableError,
    SessionLimitError,
    SessionNotFoundError,
)
from .events import new_id
from .key_limits import KeyLimiter, KeyLimits
from .keys import SessionKeys
from .leases import LeaseRegistry
from .metrics import SessionMetrics
from .ownership import Ownership
from .process_beat import Handler, ProcessBeat, Request, new_process_id
from .redis_link import RedisLink
from .rehydrate import audio_end_ms, end_unfinished, read_record
from .session import Session, SessionLimits
from .sink import DetachedSink, OutputSink
from .transcription_session import check_recogniser

log = logging.getLogger("parley.sessions.manager")

DEFAULT_MAX_SESSIONS = 64
SHUTDOWN_TIMEOUT_S = 5.0
LET_GO_TIMEOUT_S = 0.5
"""How long a resume waits for a live old owner to let its session go."""
MOVED = "session_moved"
DRAINING = "server_draining"


class SessionManager:
    def __init__(
        self,
        redis: aioredis.Redis,
        pipeline: Pipeline,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        key_limits: KeyLimits | None = None,
        limits: SessionLimits | None = None,
        lease_ttl_s: float = 30.0,
        metrics: SessionMetrics | None = None,
        link: RedisLink | None = None,
        clock: Clock = REAL_CLOCK,
        process_id: str | None = None,
    ) -> None:
        """`clock`: the time its sessions live by (tests compress it); the upkeep that
        renews leases and key expiries stays on wall time, as Redis expires them in its own.
        `process_id`: this process among those sharing the Redis (random by default).
        `key_limits`: what one caller may hold and start (by default, nothing counted)."""
        self.redis = redis
        self.process_id = process_id or new_process_id()
        self.ownership = Ownership(redis, self.process_id)
        self.clock = clock
        self.link = link or RedisLink(redis)
        self.beat = ProcessBeat(redis, self.process_id, self._on_request, self.link)
        self._request_handlers: dict[str, Handler] = {}
        self.pipeline = pipeline
        self.limits = limits or SessionLimits()
        self.metrics = metrics or SessionMetrics()
        self.leases = LeaseRegistry(redis, max_sessions, ttl_s=lease_ttl_s)
        self.configured_max_sessions = max_sessions
        """The cap as configured (`--max-sessions`); `hold_to` may lower the one applied."""
        self.capacity: PipelineCapacity | None = None
        """What the pipeline said it can serve, once started (`hold_to`)."""
        self.key_limits = KeyLimiter(redis, key_limits or KeyLimits(), ttl_s=lease_ttl_s)
        self.admission = Admission(self.link, self.leases, self.key_limits, self.metrics)
        self._callers: dict[str, str] = {}
        """Per live session started for a caller: the caller its slot counts against."""
        self._sessions: dict[str, Session] = {}
        self._owners = TaskSet("sessions")  # each session's `_own` task; close() closes it
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the same tasks, by session id
        self._background: list[asyncio.Task[None]] = []
        self._lease_locks: dict[str, asyncio.Lock] = {}
        """Per live session: its lease's renewal and its release take turns. A renewal
        (which re-takes a lapsed lease) that reached Redis after the session's release
        would hold the slot for a session that has ended, until the lease's TTL."""
        self._unreleased: set[str] = set()
        """Sessions that closed during an outage: their lease and keys go when Redis is back
        (rather than at their TTLs)."""
        self._accepting = True

    @property
    def max_sessions(self) -> int:
        return self.leases.cap

    def hold_to(self, capacity: PipelineCapacity | None, processes: int = 1) -> int:
        """Once the pipeline has started: admit no more sessions than it can serve, the
        smaller of the configured cap and `capacity` across the `processes` server processes
        that share this Redis (each with its own graph; stages they share counted once).
        The cap is service-wide (every process's leases in one set), so every process sets
        the same figure. Returns the cap now applied."""
        self.capacity = capacity
        cap = self.configured_max_sessions
        if capacity is None:
            log.info("session cap %d (--max-sessions; the pipeline states no capacity)", cap)
            self.leases.cap = cap
            return cap
        serves = capacity.across(processes)
        for line in capacity.lines():
            log.info("capacity: %s", line)
        self.leases.cap = max(1, min(cap, serves))  # a lease registry's cap is at least 1
        across = f" across {processes} server processes" if processes > 1 else ""
        log.info(
            "session cap %d: the smaller of --max-sessions %d and the %d sessions the "
            "pipeline can serve at once%s",
            self.leases.cap,
            cap,
            serves,
            across,
        )
        return self.leases.cap

    async def __aenter__(self) -> SessionManager:
        self.beat.start()
        self._background = [
            background(self._upkeep_loop(), "sessions:upkeep"),
            background(self.link.run(), "sessions:redis-link"),
            background(self.link.writes.run(), "sessions:redis-writes"),
            background(self._watch_redis(), "sessions:redis-outages"),
            background(self._watch_refusals(), "sessions:redis-refusals"),
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
        *,
        caller: str | None = None,
    ) -> Session:
        """Admit and start a session; raises SessionLimitError at the cap, KeyLimitError
        (a SessionLimitError) at `caller`'s limits, ConfigError on bad settings."""
        if not isinstance(config, SessionConfig):
            config = SessionConfig.parse(config)
        check_recogniser(config, self.pipeline)  # a transcription session needs one
        session_id = session_id or new_id("sess")
        duplex = self._open_duplex(session_id)  # first: refused, it has taken nothing
        try:
            return await self._create(sink, config, session_id, caller, duplex)
        except BaseException:
            if duplex is not None:
                duplex.close()
            raise

    async def _create(
        self,
        sink: OutputSink,
        config: SessionConfig,
        session_id: str,
        caller: str | None,
        duplex: DuplexTurns | None,
    ) -> Session:
        if not self._accepting:
            raise SessionLimitError("the server is shutting down")
        await self.admission.admit(session_id, caller)
        try:
            fence = await self.link.call(
                lambda: self.ownership.claim(session_id, self.limits.key_ttl_s)
            )
        except RedisFullError:  # the lease script got in (it deletes first), the claim not
            self.metrics.redis_write_refusals.labels("oom").inc()
            self.metrics.session_limit_rejections.inc()
            await self.admission.release_quietly(session_id)
            raise SessionLimitError(FULL) from None
        except (RedisError, OSError) as exc:  # admitted a moment ago: it goes on unfenced
            log.warning("session %s: ownership not recorded: %s", session_id, exc)
            fence = 0
        session = self._new_session(session_id, config, sink, fence=fence, duplex=duplex)
        if caller is not None and self.admission.counts(caller):
            self._callers[session_id] = caller
        self._start(session)
        return session

    async def check_caller(self, caller: str) -> None:
        """KeyLimitError if `caller` could not start a session now (admission.py)."""
        await self.admission.check_caller(caller)

    def _new_session(
        self, session_id: str, config: SessionConfig, sink: OutputSink, **resumed: Any
    ) -> Session:
        return Session(
            session_id=session_id,
            config=config,
            redis=self.redis,
            pipeline=self.pipeline,
            sink=sink,
            limits=self.limits,
            metrics=self.metrics,
            link=self.link,
            clock=self.clock,
            **resumed,
        )

    def _open_duplex(self, session_id: str) -> DuplexTurns | None:
        try:
            return DuplexTurns.on(self.pipeline, session_id)
        except SessionLimitError:
            self.metrics.session_limit_rejections.inc()
            raise

    def _start(self, session: Session) -> None:
        session_id = session.session_id
        self._sessions[session_id] = session
        self._lease_locks[session_id] = asyncio.Lock()
        self.metrics.active_sessions.inc()
        self._tasks[session_id] = self._owners.create_task(self._own(session), name=session_id)

    async def resume(
        self, session_id: str, token: str | None, *, caller: str | None = None
    ) -> Session | None:
        """A session that another process created (or held), resumed here with its resume
        token: built from Redis and owned here from now on. None when there is no such
        session or the token is wrong; SessionLimitError when this process admits nothing
        (draining) or the cap is full and its lease has lapsed. `caller`: whom it counts
        against from now on (it was admitted once: its limit does not refuse it)."""
        if session_id in self._sessions or token is None:
            return None
        record = await self.link.call(lambda: read_record(self.redis, session_id))
        if record is None or not record.matches(token):
            return None
        if not self._accepting:
            raise SessionLimitError("this server is shutting down; reconnect to resume")
        if self.link.refusing:
            raise SessionLimitError(FULL)
        if not await self.link.call(lambda: self.leases.acquire(session_id)):
            raise SessionLimitError(f"all {self.leases.cap} session slots are in use")
        taken = await self.link.call(lambda: self.ownership.take_over(session_id))
        if not taken.fence:  # it ended meanwhile: the slot just taken is nobody's
            await self.link.call(lambda: self.leases.release(session_id))
            return None
        previous = taken.previous_owner
        if previous and previous != self.process_id and await self.beat.alive(previous):
            let_go = {"op": "let_go", "session_id": session_id, "fence": taken.fence}
            if not await self.beat.ask(previous, let_go, LET_GO_TIMEOUT_S):
                log.warning("session %s: %s did not let go in time", session_id, previous)
        session = self._new_session(
            session_id,
            record.config,
            DetachedSink(),
            resume_token=record.resume_token,
            fence=taken.fence,
            rehydrated=True,
        )
        session.transport = record.transport
        await session.history.load()
        offset = await self.link.call(lambda: audio_end_ms(self.redis, session_id))
        if session_id in self._sessions or not await session.store.owns():
            return None  # another resume (here or elsewhere) took it meanwhile
        ended = await end_unfinished(session.history, await session.event_log.replay())
        session.recover(offset, ended)
        try:  # a duplex model's state for it is gone: it starts a new stream
            session.duplex = self._open_duplex(session_id)
        except SessionLimitError:
            await self.admission.release_quietly(session_id)
            raise
        if caller is not None and self.admission.counts(caller):
            self._callers[session_id] = caller
            await self._renew_key_slot(caller, session_id)
        self._start(session)
        log.info("session %s resumed here from %s", session_id, previous or "nobody")
        return session

    async def hand_over(self, session_id: str, reason: str = MOVED) -> bool:
        """End the local session without deleting its keys and let any process resume it
        at once; its client is told to reconnect. False when it is not here."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        await self._let_go(session, reason)
        if session.store.fence:
            try:
                await self.link.call(
                    lambda: self.ownership.release(session_id, session.store.fence)
                )
            except (RedisError, OSError) as exc:  # the next resume takes it over anyway
                log.warning("session %s: ownership not released: %s", session_id, exc)
        return True

    async def hand_over_all(self, reason: str = DRAINING) -> int:
        """Drain: admit nothing more, hand over every session whose transport can resume
        it elsewhere (`Session.movable`: the WebSocket endpoints); returns how many. The
        others (WebRTC, SIP, Twilio calls) go on until `close()`."""
        self._accepting = False
        ids = [sid for sid, session in self._sessions.items() if session.movable]
        await asyncio.gather(*(self.hand_over(sid, reason) for sid in ids))
        return len(ids)

    async def let_go_if_lost(self, session_id: str) -> bool:
        """If another process took the local session over (and this one was not told),
        end the local copy without a write; True when it did."""
        session = self._sessions.get(session_id)
        if session is None or await session.store.owns():
            return False
        await self._let_go(session, MOVED, flush=False)
        return True

    async def _let_go(self, session: Session, reason: str, *, flush: bool = True) -> None:
        session.request_hand_over(reason, flush=flush)
        task = self._tasks.get(session.session_id)
        if task is not None:
            await asyncio.wait({task}, timeout=SHUTDOWN_TIMEOUT_S)

    def serve_requests(self, op: str, handler: Handler) -> None:
        """Let `handler` answer other processes' `op` requests (the relays' of sidebands and
        HTTP requests, say)."""
        self._request_handlers[op] = handler

    async def _on_request(self, request: Request) -> None:
        """A request from another process (process_beat.py)."""
        op = str(request.get("op"))
        if op != "let_go":
            if (handler := self._request_handlers.get(op)) is None:
                log.warning("unknown request %r", op)
            else:
                await handler(request)
            return
        session = self._sessions.get(str(request.get("session_id")))
        if session is not None:  # taken over: it ends here without a trace
            await self._let_go(session, MOVED)

    async def _own(self, session: Session) -> None:
        """The session's task: runs it, then frees its slot whatever happened."""
        try:
            await session.run()
        except Exception:
            log.exception("session %s ended with an error", session.session_id)
        finally:
            self._sessions.pop(session.session_id, None)
            lease_lock = self._lease_locks.pop(session.session_id)
            caller = self._callers.pop(session.session_id, None)
            self.metrics.active_sessions.dec()
            async with lease_lock:  # after a renewal in flight, which would undo the release
                if session.moving or session.store.lost:  # the lease goes on with it
                    log.info("session %s left (%s)", session.session_id, session.close_reason)
                else:
                    await self._release(session)
                if caller is not None:  # a resume elsewhere counts it again
                    await self._release_key_slot(caller, session.session_id)

    async def _release(self, session: Session) -> None:
        try:
            await self.link.call(lambda: self.leases.release(session.session_id))
        except (RedisError, OSError):  # RedisUnavailableError is an OSError
            self._unreleased.add(session.session_id)
        log.info("session %s closed (%s)", session.session_id, session.close_reason)

    async def _release_key_slot(self, caller: str, session_id: str) -> None:
        try:
            await self.link.call(lambda: self.key_limits.release(caller, session_id))
        except (RedisError, OSError) as exc:  # it lapses after its TTL
            log.warning("session %s: its key's slot not freed: %s", session_id, exc)

    async def _renew_key_slot(self, caller: str, session_id: str) -> None:
        try:
            await self.link.call(lambda: self.key_limits.renew(caller, session_id))
        except (RedisError, OSError) as exc:  # the upkeep takes it again
            log.warning("session %s: its key's slot not renewed: %s", session_id, exc)

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
            await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT_S)
        await self._owners.close()  # those past the timeout are cut
        self._tasks.clear()
        background, self._background = self._background, []
        await cancel_and_wait(*background)
        await self.beat.stop()

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
        lease_lock = self._lease_locks.get(session.session_id)
        if lease_lock is None:
            return  # it has ended
        async with lease_lock:
            if self._sessions.get(session.session_id) is session:
                await self._renew_live(session)

    async def _renew_live(self, session: Session) -> None:
        if not await session.store.owns():  # taken over while this process was not told
            log.warning("session %s: another process owns it; it ends here", session.session_id)
            session.request_hand_over(MOVED, flush=False)
            return
        if not await self.link.call(lambda: self.leases.renew(session.session_id)):
            log.warning(
                "session %s lost its lease and the cap is full; it goes on uncounted",
                session.session_id,
            )
        caller = self._callers.get(session.session_id)
        if caller is not None:
            await self.link.call(lambda: self.key_limits.renew(caller, session.session_id))
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

    async def _watch_refusals(self) -> None:
        """Tell every session once that Redis refuses writes; when a probe write is taken
        again, every session writes back what it kept. A write back that meets the limit
        again belongs to the same refusal: it is tried again at the next accepted probe."""
        refusal = 0
        while True:
            refusal = await self.link.next_refusal(refusal)
            self.metrics.redis_accepts_writes.set(0)
            for session in list(self._sessions.values()):
                session.redis_full(refusal)
            while True:
                await self.link.wait_writable()
                try:
                    written = await self._write_back_kept()
                except RedisUnavailableError:  # refused again (or down): the next probe
                    await asyncio.sleep(self.link.probe_interval_s)
                    continue
                except RedisError as exc:
                    log.error("Redis accepts writes again but writing back failed: %s", exc)
                    written = -1
                break
            self.link.refusal_over()
            self.metrics.redis_accepts_writes.set(1)
            if written >= 0:
                log.info(
                    "Redis accepts writes again %s; %d live sessions wrote back what they kept",
                    self.link.summary(),
                    written,
                )

    async def _write_back_kept(self) -> int:
        """After a refusal: leases renewed (the upkeep may have met it), spills written back."""
        sessions = list(self._sessions.values())
        for session in sessions:
            await self._renew(session)
            await session.write_back_after_refusal()
        return len(sessions)

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
