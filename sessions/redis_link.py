"""Whether this process can reach its Redis, decided in one place.

Every Redis call of the session core that can run while a call is live goes through
`RedisLink.call`: a deadline (redis-py retries a refused connection three times with
exponential backoff by default, so one failing call takes about 6 s, and a minute against a
stopped server), and a verdict. The first call that fails for want of a server marks the
link down; from then on nobody on a media path waits for Redis: writes go to the session's
spill (spill.py) and reads use local copies or fail at once with `RedisUnavailableError`.
Only the link's own probe talks to Redis until it answers again.

A Redis at its memory limit (`maxmemory` with `noeviction`) answers, reads included, but
refuses writes with `OOM`. For a session's writes that is an outage too: the first refused
write begins a *refusal* (`refused()`), from then on writes go to the spills while reads
still go to Redis, and a probe write (`SET` of a key that never exists, with `XX`: refused
at the limit, a no-op otherwise; a PING would answer all along) says when Redis takes
writes again. The refusal ends when the session manager has written back what was kept
(`refusal_over()`); a write back that meets the limit again belongs to the same refusal.

One warning says the link went down (or that Redis refuses writes) and one info line says
it is back, with what the episode cost (writes spilled, writes dropped); nothing is logged
per write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    OutOfMemoryError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import RedisFullError, RedisUnavailableError
from .keys import NAMESPACE
from .write_batcher import WriteBatcher

log = logging.getLogger("parley.sessions.redis")

T = TypeVar("T")

CALL_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.25
REDIAL_AFTER_S = 5.0
"""While down: after this long of failed probes, and as often again, the client's connections
are dropped and dialled afresh (a client that has one, `reset_connections`: the cluster
client). A CI run once saw a cluster's probe fail for 20 s after every node said
`cluster_state:ok` again, a client wedged by the node's death; a fresh dial costs nothing
during an outage."""
HEARTBEAT_INTERVAL_S = 1.0

OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,  # refused, reset, closed by server
    RedisTimeoutError,
    BusyLoadingError,  # a restarted server still loading its dataset
    TryAgainError,
    ClusterDownError,  # a Redis Cluster with slots out of reach (CLUSTERDOWN, MASTERDOWN)
    SlotNotCoveredError,  # the cluster client's slot map has no node for the key's slot
    TimeoutError,  # our own deadline
    OSError,
)
"""Failures that mean "no server to talk to", as opposed to a command we got wrong."""

WRITE_PROBE_KEY = f"{NAMESPACE}:write-probe"
"""The key the write probe sets only if it exists: it never does, so nothing is written."""


@dataclass(slots=True)
class OutageStats:
    """What one outage (or refusal) cost, summed over the process; reset when the next
    one begins."""

    started: float = 0.0
    spilled: int = 0
    """Writes kept locally instead of going to Redis."""
    dropped: int = 0
    """Spilled writes given up because a session's spill was full (oldest first)."""
    restored: int = 0
    """Spilled writes written to Redis after it came back."""
    refused: int = 0
    """Writes Redis refused for want of memory (each was kept)."""
    probe_errors: set[str] = field(default_factory=set)
    """Kinds of error, other than an outage's, that the probe met (each logged once)."""
    last_probe_error: str = ""
    """Why the last probe found no server (said again while an outage lasts)."""
    redials: int = 0


class RedisLink:
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        probe_interval_s: float = PROBE_INTERVAL_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.redis = redis
        self.call_timeout_s = call_timeout_s
        self.probe_interval_s = probe_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.up = True
        self.outages = 0
        """How many outages began so far; the number of the current or last one."""
        self.refusing = False
        """Redis answers but refuses writes (OOM): writes are kept, reads go on."""
        self.refusals = 0
        """How many refusals began so far; the number of the current or last one."""
        self._refusal_open = False
        """A refusal began and its kept writes are not all written back yet."""
        self.stats = OutageStats()
        self._failing_since: float | None = None
        """When the watch's probes of the current outage began failing (None: not failing)."""
        self._changed = asyncio.Event()
        self.writes = WriteBatcher(redis, call_timeout_s)
        """The process's writes, several sessions' to a pipeline (its `run()` is the
        owner's to start, next to `run()` here)."""

    # --- the verdict ---------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """Whether a write may go to Redis now (it answers and does not refuse writes)."""
        return self.up and not self.refusing

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis call under the call deadline; raises RedisUnavailableError (and
        marks the link down) when the server cannot be reached, RedisFullError (a
        RedisUnavailableError; a refusal begins) when it refused a write for want of
        memory. Other Redis errors (a bad command, a wrong type) pass through: they are
        bugs, not outages."""
        if not self.up:
            raise self.unavailable()
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        try:
            async with asyncio.timeout(self.call_timeout_s):
                result = await make()
        except OUTAGE_ERRORS as exc:
            self.went_down(exc)
            raise self.unavailable() from exc
        except OutOfMemoryError as exc:
            self.refused(exc)
            raise self.full() from exc
        if task is not None and task.cancelling() > cancels:
            # On Python 3.11, redis-py's `asyncio.wait_for` around a socket write swallows
            # a cancel that lands as the write completes; the owner's cancel (a session
            # closing its event-log writer) would then never take, and its close would
            # wait forever, holding the session slot. Deliver it here.
            raise asyncio.CancelledError
        return result

    def unavailable(self) -> RedisUnavailableError:
        return RedisUnavailableError("the session store (Redis) is unreachable")

    def full(self) -> RedisFullError:
        return RedisFullError("the session store (Redis) is full and refuses writes")

    def unwritable(self) -> RedisUnavailableError:
        """The error for a write that cannot go to Redis now, whichever the reason."""
        return self.unavailable() if not self.up else self.full()

    def went_down(self, exc: BaseException) -> None:
        """A call found no server. Idempotent within one outage."""
        if not self.up:
            return
        self.up = False
        self.outages += 1
        self.stats = OutageStats(started=time.monotonic())
        log.warning(
            "Redis is unreachable (%s: %s); sessions go on, their writes are kept locally "
            "until it answers",
            type(exc).__name__,
            str(exc) or f"no answer within {self.call_timeout_s:g} s",
        )
        self._wake_waiters()

    def came_back(self) -> None:
        if self.up:
            return
        self.up = True
        self._wake_waiters()

    def refused(self, exc: BaseException) -> None:
        """Redis refused a write for want of memory (the caller keeps the write). Begins a
        refusal unless one is open: a write back that meets the limit again is part of it."""
        if not self._refusal_open:
            self._refusal_open = True
            self.refusals += 1
            self.stats = OutageStats(started=time.monotonic())
            log.warning(
                "Redis refuses writes, out of memory (%s); sessions go on, their writes "
                "are kept locally until it takes writes again",
                str(exc) or type(exc).__name__,
            )
        self.stats.refused += 1
        if not self.refusing:
            self.refusing = True
            self._wake_waiters()

    def accepts_writes(self) -> None:
        """The write probe was accepted: the spills may write back."""
        if not self.refusing:
            return
        self.refusing = False
        self._wake_waiters()

    def refusal_over(self) -> None:
        """What was kept during the refusal is written back (the session manager's word):
        a later refused write begins a new one."""
        self._refusal_open = False

    def summary(self) -> str:
        """The outage (or refusal) in one line, for the log line that says it is over."""
        s = self.stats
        refused = f"{s.refused} writes refused (out of memory), " if s.refused else ""
        return (
            f"after {time.monotonic() - s.started:.1f} s: {refused}{s.spilled} writes kept "
            f"locally, {s.restored} written back, {s.dropped} dropped (spill full)"
        )

    def _wake_waiters(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def next_outage(self, after: int) -> int:
        """Wait until an outage later than number `after` has begun; returns its number."""
        while self.outages <= after:
            await self._changed.wait()
        return self.outages

    async def wait_up(self) -> None:
        while not self.up:
            await self._changed.wait()

    async def next_refusal(self, after: int) -> int:
        """Wait until a refusal later than number `after` has begun; returns its number."""
        while self.refusals <= after:
            await self._changed.wait()
        return self.refusals

    async def wait_writable(self) -> None:
        while not self.writable:
            await self._changed.wait()

    # --- the watch -------------------------------------------------------------------------

    async def _redial(self) -> None:
        reset = getattr(self.redis, "reset_connections", None)
        if reset is None:
            return
        try:
            # bounded like any call: a reset that hangs (closing a connection stuck on a
            # dead node) would stop the watch, and the outage would never be seen to end
            async with asyncio.timeout(self.call_timeout_s):
                await reset()
        except Exception as exc:
            self._probe_failed(exc)

    async def run(self) -> None:
        """Heartbeat while up (so an outage is noticed even with no call writing), probe
        while down, probe with a write while Redis refuses writes; runs until cancelled by
        its owner (the session manager). An error that is no known outage (redis-py's
        cluster client raises its own while the slot map is in flux) is logged and the
        watch goes on: were it to end, an outage would never be seen to end, and sessions
        would keep their writes locally for good."""
        self._failing_since = None
        while True:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the owner's cancel
                # a client library's own (a future of a connection it dropped): were the
                # watch to end on it, nothing would probe again and the outage never end
                self.stats.probe_errors.add("CancelledError")
                log.warning("Redis watch: the client raised a cancel nobody asked for")

    async def _watch_once(self) -> None:
        """One turn of the watch: a heartbeat, a probe or a write probe."""
        if not self.up:
            await asyncio.sleep(self.probe_interval_s)
            if await self._probe():
                self._failing_since = None
                self.came_back()
                return
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            elif now - self._failing_since >= REDIAL_AFTER_S:
                self._failing_since = now
                self._still_down()
                await self._redial()
        elif self.refusing:
            await asyncio.sleep(self.probe_interval_s)
            if await self._write_probe():
                self.accepts_writes()
        else:
            await asyncio.sleep(self.heartbeat_interval_s)
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        try:
            await self.call(self.redis.ping)
        except RedisUnavailableError:
            pass  # went_down() logged it
        except Exception as exc:
            log.warning("Redis heartbeat: %s: %s", type(exc).__name__, exc)

    async def _probe(self) -> bool:
        """Whether Redis answers again."""
        try:
            async with asyncio.timeout(self.call_timeout_s):
                await self.redis.ping()
        except OUTAGE_ERRORS as exc:
            self.stats.last_probe_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return False
        except Exception as exc:  # not back, for a reason of its own: said once an outage
            self._probe_failed(exc)
            return False
        return True

    async def _write_probe(self) -> bool:
        """Whether Redis takes a write again: `SET ... XX` of a key that does not exist is
        refused at the memory limit like any write, and writes nothing otherwise."""
        try:
            async with asyncio.timeout(self.call_timeout_s):
                await self.redis.set(WRITE_PROBE_KEY, b"", xx=True)
        except OutOfMemoryError:
            return False
        except OUTAGE_ERRORS as exc:
            self.went_down(exc)  # the down probe takes over
            return False
        except Exception as exc:
            self._probe_failed(exc)
            return False
        return True

    def _still_down(self) -> None:
        """An outage that lasts is said again, with the probe's last error, after 1, 2, 4,
        8, ... redials: an operator (or a test that waits for the end) sees why."""
        self.stats.redials += 1
        if self.stats.redials & (self.stats.redials - 1) == 0:
            log.warning(
                "Redis still unreachable after %.0f s (%s); dialling afresh",
                time.monotonic() - self.stats.started,
                self.stats.last_probe_error or "no answer",
            )

    def _probe_failed(self, exc: BaseException) -> None:
        kind = type(exc).__name__
        if kind not in self.stats.probe_errors:  # said once an outage (or refusal)
            self.stats.probe_errors.add(kind)
            log.warning("Redis probe: %s: %s; probing on", kind, exc)
