"""Whether this process can reach its Redis, decided in one place.

Every Redis call of the session core that can run while a call is live goes through
`RedisLink.call`: a deadline (redis-py retries a refused connection three times with
exponential backoff by default, so one failing call takes about 6 s, and a minute against a
stopped server), and a verdict. The first call that fails for want of a server marks the
link down; from then on nobody on a media path waits for Redis: writes go to the session's
spill (spill.py) and reads use local copies or fail at once with `RedisUnavailableError`.
Only the link's own probe talks to Redis until it answers again.

One warning says the link went down and one info line says it is back, with what the
outage cost (writes spilled, writes dropped); nothing is logged per write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import BusyLoadingError, ClusterDownError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import RedisUnavailableError
from .write_batcher import WriteBatcher

log = logging.getLogger("parley.sessions.redis")

T = TypeVar("T")

CALL_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.25
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


@dataclass(slots=True)
class OutageStats:
    """What one outage cost, summed over the process; reset when the next one begins."""

    started: float = 0.0
    spilled: int = 0
    """Writes kept locally instead of going to Redis."""
    dropped: int = 0
    """Spilled writes given up because a session's spill was full (oldest first)."""
    restored: int = 0
    """Spilled writes written to Redis after it came back."""
    probe_errors: set[str] = field(default_factory=set)
    """Kinds of error, other than an outage's, that the probe met (each logged once)."""


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
        self.stats = OutageStats()
        self._changed = asyncio.Event()
        self.writes = WriteBatcher(redis, call_timeout_s)
        """The process's writes, several sessions' to a pipeline (its `run()` is the
        owner's to start, next to `run()` here)."""

    # --- the verdict ---------------------------------------------------------------------

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis call under the call deadline; raises RedisUnavailableError (and
        marks the link down) when the server cannot be reached. Other Redis errors (a bad
        command, a wrong type) pass through: they are bugs, not outages."""
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
        if task is not None and task.cancelling() > cancels:
            # On Python 3.11, redis-py's `asyncio.wait_for` around a socket write swallows
            # a cancel that lands as the write completes; the owner's cancel (a session
            # closing its event-log writer) would then never take, and its close would
            # wait forever, holding the session slot. Deliver it here.
            raise asyncio.CancelledError
        return result

    def unavailable(self) -> RedisUnavailableError:
        return RedisUnavailableError("the session store (Redis) is unreachable")

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

    def summary(self) -> str:
        """The outage in one line, for the log line that says Redis is back."""
        s = self.stats
        return (
            f"after {time.monotonic() - s.started:.1f} s: {s.spilled} writes kept locally, "
            f"{s.restored} written back, {s.dropped} dropped (spill full)"
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

    # --- the watch -------------------------------------------------------------------------

    async def run(self) -> None:
        """Heartbeat while up (so an outage is noticed even with no call writing), probe
        while down; runs until cancelled by its owner (the session manager). An error that
        is no known outage (redis-py's cluster client raises its own while the slot map is
        in flux) is logged and the watch goes on: were it to end, an outage would never be
        seen to end, and sessions would keep their writes locally for good."""
        while True:
            if self.up:
                await asyncio.sleep(self.heartbeat_interval_s)
                await self._heartbeat()
            else:
                await asyncio.sleep(self.probe_interval_s)
                if await self._probe():
                    self.came_back()

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
        except OUTAGE_ERRORS:
            return False
        except Exception as exc:  # not back, for a reason of its own: said once an outage
            kind = type(exc).__name__
            if kind not in self.stats.probe_errors:
                self.stats.probe_errors.add(kind)
                log.warning("Redis probe: %s: %s; probing on", kind, exc)
            return False
        return True
