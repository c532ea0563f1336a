"""A session's Redis writes that Redis has not taken yet: kept locally, in order, bounded.

All buffers of a session (audio, frames, history, event log, its record) write through one
`Spill`. While the link is up a write goes straight to Redis. While it is down (or while
older writes are still waiting) the write is kept here instead, and written back in order
once Redis answers, so a short outage loses nothing and a long one loses the oldest media
first. The kept values stay readable, so a turn can still be built from the local copy.

Order matters only within a buffer (an audio stream's ids must grow, the event log must
replay in order), so each buffer has its own queue. The bound is on bytes for the whole
session: past it, the oldest entry of the most expendable buffer goes (audio, then frames,
then events, then history), and is counted, and the session is told (`on_drop`).

A Redis at its memory limit refuses writes (`OOM`) but answers reads: a refused write is
kept like one made during an outage, and so is every later one (order) until the link says
Redis takes writes again (redis_link.py). A write back that meets the limit again stops
at the refused write; it and those after it stay kept, to be sent again.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.asyncio.client import Pipeline
from redis.exceptions import OutOfMemoryError, RedisError

from pipeline.tasks import TaskSet

from .errors import RedisFullError, RedisUnavailableError
from .metrics import SessionMetrics
from .redis_link import RedisLink
from .write_batcher import Apply

log = logging.getLogger("parley.sessions.spill")

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
"""About two minutes of input audio (32 kB/s) with its events; per session."""
DRAIN_BATCH = 256
"""Entries per pipeline when writing back."""

DROP_ORDER = ("audio", "frames", "events", "history", "record")
"""Which buffer gives up its oldest entry first when the spill is full: media is a cache,
the history and the event log are what a resume promises."""

T = TypeVar("T")

FINISH_WAIT_S = 10.0
"""The longest a cancelled caller waits for its write to end (the call timeout bounds
each Redis call; this bounds the writes queued ahead of it too)."""

OnDrop = Callable[[str, int], None]
"""Told the buffer and how many values a full spill just gave up."""


@dataclass(slots=True)
class SpilledWrite:
    apply: Apply
    """Adds the write's commands to a pipeline."""
    size: int
    values: Sequence[Any]
    """What was written, for local reads (audio frames, images, event bodies)."""


class Spill:
    def __init__(
        self,
        link: RedisLink,
        max_bytes: int = DEFAULT_MAX_BYTES,
        metrics: SessionMetrics | None = None,
        on_drop: OnDrop | None = None,
    ) -> None:
        self.link = link
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._on_drop = on_drop
        self._queues: dict[str, collections.deque[SpilledWrite]] = {
            kind: collections.deque() for kind in DROP_ORDER
        }
        self._lock = asyncio.Lock()
        self._closed = False
        self._writes = TaskSet("spill")
        """Owns each write in flight (one carried on past a cancelled caller included);
        `aclose()` closes it."""
        self.bytes = 0
        self.kept = 0
        """Writes kept locally so far (the session's lifetime)."""
        self.dropped: collections.Counter[str] = collections.Counter()
        """Values given up because the spill was full, by buffer."""

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def pending(self, kind: str) -> list[Any]:
        """The values of `kind` kept locally, oldest first."""
        return [value for write in self._queues[kind] for value in write.values]

    def holds(self, kind: str) -> bool:
        return bool(self._queues[kind])

    def adds_only(self, kind: str) -> bool:
        """Whether every kept write of `kind` adds values (none deletes or trims), so what
        Redis holds plus `pending(kind)` is what it will hold once they are written."""
        return all(write.values for write in self._queues[kind])

    async def write(
        self, kind: str, apply: Apply, *, size: int = 0, values: Sequence[Any] = ()
    ) -> list[Any] | None:
        """Write now and return the pipeline's results, or keep the write and return None.

        A write handed over is carried to its end even when the caller is cancelled
        meanwhile (a turn cancelled while its audio read flushes the buffer): the buffer
        has let go of its values (the audio's pending frames), so a write dropped while it
        waits for the lock or for Redis would lose them. The wait is bounded by the writes
        ahead of it and the link's call timeout.

        Raises only for a Redis error that is not an outage (a bug in the commands)."""
        if self._closed:
            return None
        write = self._writes.create_task(self._write(kind, apply, size, values), log_failure=False)
        return await _finished(write)

    async def _write(
        self, kind: str, apply: Apply, size: int, values: Sequence[Any]
    ) -> list[Any] | None:
        if self._closed:
            return None
        async with self._lock:
            if self._closed:
                return None
            if self.link.writable and len(self):
                await self._drain_locked()
            if self.link.writable and not len(self):
                try:
                    return await self.link.call(lambda: self._execute([apply]))
                except RedisFullError:
                    self._count_refusal()
                except RedisUnavailableError:
                    pass
            self._keep(kind, SpilledWrite(apply, size, values))
            return None

    def discard(self, kind: str) -> None:
        """Forget the kept writes of `kind` (its buffer was cleared)."""
        queue = self._queues[kind]
        self.bytes -= sum(w.size for w in queue)
        queue.clear()

    async def settle(self) -> None:
        """If Redis takes writes, write back everything kept, so a read from Redis sees it."""
        if self.link.writable and len(self) and not self._closed:
            async with self._lock:
                await self._drain_locked()

    async def aclose(self) -> None:
        """The session ended: take no more writes, wait out the one in flight (so nothing
        lands after the session's keys are deleted), drop what is kept. Idempotent."""
        self._closed = True
        async with self._lock:
            for kind in DROP_ORDER:
                self.discard(kind)
        await self._writes.close()  # a write let go on alone after its caller's cancel

    # --- internals -------------------------------------------------------------------------

    def _keep(self, kind: str, write: SpilledWrite) -> None:
        self._queues[kind].append(write)
        self.bytes += write.size
        self.kept += 1
        self.link.stats.spilled += 1
        if self._metrics is not None:
            self._metrics.redis_spilled_writes.inc()
        while self.bytes > self.max_bytes:
            victim_kind = next(k for k in DROP_ORDER if self._queues[k])
            victim = self._queues[victim_kind].popleft()
            self.bytes -= victim.size
            count = max(1, len(victim.values))
            self.dropped[victim_kind] += count
            self.link.stats.dropped += 1
            if self._metrics is not None:
                self._metrics.redis_spill_dropped.labels(victim_kind).inc(count)
            if self._on_drop is not None:
                self._on_drop(victim_kind, count)

    def _count_refusal(self) -> None:
        if self._metrics is not None:
            self._metrics.redis_write_refusals.labels("oom").inc()

    async def _execute(self, applies: list[Apply], raise_on_error: bool = True) -> list[Any]:
        return await self.link.writes.execute(applies, raise_on_error)

    async def _drain_locked(self) -> None:
        """Write back the kept entries, buffer by buffer, in order; stops at an outage, or
        at the first write Redis refuses for want of memory."""
        for kind in reversed(DROP_ORDER):
            queue = self._queues[kind]
            while queue:
                if not self.link.writable or self._closed:
                    return
                batch = _Counted([w.apply for w in itertools.islice(queue, DRAIN_BATCH)])
                call = self._writes.create_task(
                    self.link.call(
                        functools.partial(self._execute, batch.applies, raise_on_error=False)
                    ),
                    log_failure=False,
                )
                try:
                    results = await _finished(call)
                except asyncio.CancelledError:  # what landed must not be sent again
                    if call.done() and not call.cancelled() and call.exception() is None:
                        self._written_back(kind, batch, call.result())
                    raise
                except RedisFullError:
                    self._count_refusal()
                    return
                except RedisUnavailableError:
                    return
                if not self._written_back(kind, batch, results):
                    return

    def _written_back(self, kind: str, batch: _Counted, results: list[Any]) -> bool:
        """Take the landed writes of a drained batch off their queue; False when Redis
        refused one for want of memory (it and those after it stay, for the next try)."""
        queue = self._queues[kind]
        per_write = batch.split(results)
        refused = next(
            (
                (i, r)
                for i, mine in enumerate(per_write)
                for r in mine
                if isinstance(r, OutOfMemoryError)
            ),
            None,
        )
        landed = len(per_write) if refused is None else refused[0]
        for _ in range(landed):
            self.bytes -= queue.popleft().size
        self.link.stats.restored += landed
        if self._metrics is not None:
            self._metrics.redis_restored_writes.inc(landed)
        failed = [
            r
            for mine in per_write[:landed]
            for r in mine
            if isinstance(r, RedisError) and not _landed(r)
        ]
        if refused is not None:
            self._count_refusal()
            self.link.refused(refused[1])
        if failed:  # a command Redis refused: writing it again would not help
            log.error(
                "%d spilled %s writes were refused by Redis: %s", len(failed), kind, failed[0]
            )
        return refused is None


async def _finished(call: asyncio.Future[T]) -> T:
    """The result of `call`, which is carried to its end even when the caller is cancelled
    meanwhile; the cancel is delivered after it (at most `FINISH_WAIT_S` later), and the
    caller may read the outcome from `call`. For writes that must not stop half way (a
    write dropped after the buffer let go of its values loses them; one sent again after it
    landed lands twice)."""
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        deadline = asyncio.get_running_loop().time() + FINISH_WAIT_S
        while not call.done():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:  # a cancel is never held back for good: the write goes on alone
                call.add_done_callback(_retrieve)
                raise
            try:
                await asyncio.wait({call}, timeout=left)
            except asyncio.CancelledError:
                continue
        _retrieve(call)
        raise


def _retrieve(call: asyncio.Future[Any]) -> None:
    """The caller reads the outcome from `call` if it cares; retrieved so that none is
    reported as never retrieved."""
    if call.done() and not call.cancelled():
        call.exception()


class _Counted:
    """Writes for one pipeline that note how many commands each adds, so the pipeline's
    results can be told apart per write (other sessions' writes may share the pipeline)."""

    def __init__(self, applies: list[Apply]) -> None:
        self.counts = [0] * len(applies)
        self.applies = [self._counting(i, apply) for i, apply in enumerate(applies)]

    def _counting(self, index: int, apply: Apply) -> Apply:
        def counted(pipe: Pipeline) -> None:
            before = len(pipe)
            apply(pipe)
            self.counts[index] = len(pipe) - before

        return counted

    def split(self, results: list[Any]) -> list[list[Any]]:
        """The results of each write, in order."""
        out, at = [], 0
        for count in self.counts:
            out.append(results[at : at + count])
            at += count
        return out


def _landed(error: RedisError) -> bool:
    """An XADD refused because its id is there already: the write timed out on our side
    (a stalled server) but reached Redis, so it is not lost."""
    return "equal or smaller than the target stream top item" in str(error)
