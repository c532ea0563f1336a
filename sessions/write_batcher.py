"""One Redis pipeline for the writes of every session of the process, as they come.

Each session writes its buffers through its spill, a pipeline per write: a streaming
session flushes audio five times a second and its event log after each burst of events.
redis-py spends ~50 us of Python per pipeline on its own (a connection from the pool, a
health check, timeouts, the reply parser) before the commands themselves, so with 150
streaming sessions a process spent a sixth of its time on pipelines of one or two
commands.

`WriteBatcher.execute` queues a write (the commands a spill adds to a pipeline) and waits
for its results. One writer task sends whatever is queued as one pipeline, waits for the
replies and hands each write its share; writes that come while a pipeline is in flight go
in the next. Nothing waits on purpose: an idle process sends each write at once, as
before, and a busy one sends fewer, larger pipelines (as Nagle's algorithm does for TCP).

A command Redis refuses fails only its own write (as `raise_on_error` asks); an outage
fails every write of the pipeline, and each spill keeps its own (spill.py). Without a
running writer (a buffer used on its own, the process shutting down), writes go straight
to Redis as before.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from .errors import RedisUnavailableError

Apply = Callable[[Pipeline], None]

MAX_QUEUED = 4_096
"""Writes waiting at most; past it a write goes straight to Redis (the writer is stuck)."""
SEND_TIMEOUT_S = 2.0
"""How long one pipeline may take before its writes fail as an outage."""


@dataclass(slots=True, eq=False)
class _Write:
    applies: list[Apply]
    raise_on_error: bool
    done: asyncio.Future[list[Any]]


class WriteBatcher:
    def __init__(self, redis: aioredis.Redis, send_timeout_s: float = SEND_TIMEOUT_S) -> None:
        self.redis = redis
        self.send_timeout_s = send_timeout_s
        self._queue: collections.deque[_Write] = collections.deque()
        self._wake = asyncio.Event()
        self._running = False
        self.pipelines = 0
        """Pipelines sent so far, and the writes they carried (the tests read both)."""
        self.writes = 0

    async def execute(self, applies: list[Apply], raise_on_error: bool = True) -> list[Any]:
        """The results of `applies`' commands, as `pipeline.execute(raise_on_error)` would
        give them for a pipeline of their own."""
        if not self._running or len(self._queue) >= MAX_QUEUED:
            return await self._direct(applies, raise_on_error)
        done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieve)
        write = _Write(applies, raise_on_error, done)
        self._queue.append(write)
        self._wake.set()
        try:
            return await asyncio.shield(done)  # a cancel must not fail the others' writes
        except asyncio.CancelledError:
            if write in self._queue:  # not sent: it never will be
                self._queue.remove(write)
            else:  # on its way: let go only once it landed, as a pipeline of its own would
                await _uncancellable(done)
            raise

    async def run(self) -> None:
        """Send what is queued, a pipeline at a time, until cancelled by the owner (the
        session manager); writes still queued then fail as if Redis were gone."""
        self._running = True
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue:
                    batch = list(self._queue)
                    self._queue.clear()
                    await self._send(batch)
        finally:
            self._running = False
            _fail(self._queue, _stopped())
            self._queue.clear()

    async def _direct(self, applies: list[Apply], raise_on_error: bool) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for apply in applies:
            apply(pipe)
        return list(await pipe.execute(raise_on_error=raise_on_error))

    async def _send(self, batch: list[_Write]) -> None:
        sizes = []
        self.pipelines += 1
        self.writes += len(batch)
        try:
            pipe = self.redis.pipeline(transaction=False)
            for write in batch:
                before = len(pipe)
                for apply in write.applies:
                    apply(pipe)
                sizes.append(len(pipe) - before)
            async with asyncio.timeout(self.send_timeout_s):
                results = list(await pipe.execute(raise_on_error=False))
        except asyncio.CancelledError:
            _fail(batch, _stopped())
            raise
        except Exception as exc:  # an outage (or a bug): every write of the pipeline failed
            _fail(batch, exc)
            return
        at = 0
        for write, size in zip(batch, sizes, strict=True):
            mine, at = results[at : at + size], at + size
            if write.done.done():
                continue
            failed = next((r for r in mine if isinstance(r, RedisError)), None)
            if write.raise_on_error and failed is not None:
                write.done.set_exception(failed)
            else:
                write.done.set_result(mine)


def _stopped() -> RedisUnavailableError:
    return RedisUnavailableError("the session store's writer stopped")


def _fail(writes: Iterable[_Write], error: BaseException) -> None:
    """Fail every write not answered yet with `error`."""
    for write in writes:
        if not write.done.done():
            write.done.set_exception(error)


def _retrieve(done: asyncio.Future[list[Any]]) -> None:
    if not done.cancelled():
        done.exception()


async def _uncancellable(done: asyncio.Future[list[Any]]) -> None:
    """Wait for `done` through any cancels (a send ends within its timeout)."""
    while not done.done():
        try:
            await asyncio.wait({done})
        except asyncio.CancelledError:
            continue
