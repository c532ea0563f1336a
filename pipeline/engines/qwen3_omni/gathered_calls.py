"""Calls on a model thread that are gathered: those waiting when the thread is free run as one.

For work that batches but is not a decode step: the Talker's prefill, which each request
needs once, when its first reply token arrives. Ten sessions that spoke at once reach it
within a few milliseconds of each other, and run one after another they would hold every
session's frames (the same thread runs them) for ten prefills. Here the batch is taken on
the model thread when its turn comes, so every call asked for by then is in it.

A batch that fails runs again one call at a time, so that only a bad one fails; not after a
sticky device error (`ModelThread.fatal`): then every call waiting fails, as will later ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ...tasks import TaskSet
from .model_thread import ModelThread
from .waiting_list import WaitingList, answer, fail

ItemT = TypeVar("ItemT")


class GatheredCalls(Generic[ItemT]):
    def __init__(
        self,
        name: str,
        thread: ModelThread,
        run: Callable[[list[ItemT]], None],
        *,
        max_batch: int = 8,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.name = name
        self.thread = thread
        self.run = run
        """Does the work for a batch of items, in place (on the model thread)."""
        self.max_batch = max_batch
        self.largest_batch = 0
        """The most calls one batch has run (for tests and metrics)."""
        self._waiting: WaitingList[ItemT, None] = WaitingList()
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet(name)
        """Owns the dispatcher (`_task`); `close()` closes it."""

    def start(self) -> None:
        if self._task is None:
            self._task = self._tasks.create_task(self._dispatch(), name=f"{self.name}:gathered")

    async def close(self) -> None:
        """Stop; calls still waiting fail. Idempotent."""
        self._task = None
        await self._tasks.close()
        self._waiting.fail_all(f"{self.name} is closed")

    async def call(self, item: ItemT) -> None:
        if self._task is None:
            raise RuntimeError(f"{self.name} is not running")
        await self._waiting.add(item)

    def _take_and_run(self) -> list[tuple[ItemT, asyncio.Future[None]]]:
        """On the model thread: the calls waiting now (up to `max_batch`), run as one."""
        taken = self._waiting.take(self.max_batch)
        if taken:
            try:
                self.run([item for item, _ in taken])
            except Exception as exc:
                raise _BatchFailed(taken, exc) from exc
        return taken

    async def _dispatch(self) -> None:
        while True:
            await self._waiting.wait()
            try:
                taken = await self.thread.call(self._take_and_run)
            except _BatchFailed as failed:
                if self.thread.fatal is None:
                    await self._one_at_a_time(failed.taken, failed.error)
                    continue
                self._waiting.device_lost(failed.taken, failed.error, self.name)
                continue
            except Exception as exc:  # the batch never ran (`DeviceLost`): nor will any
                self._waiting.fail_all(f"{self.name}: {exc}")
                continue
            self.largest_batch = max(self.largest_batch, len(taken))
            for _, waiter in taken:
                answer(waiter, None)

    async def _one_at_a_time(
        self, taken: list[tuple[ItemT, asyncio.Future[None]]], error: Exception
    ) -> None:
        if len(taken) == 1:
            fail(taken[0][1], error)
            return
        for item, waiter in taken:
            if waiter.done():
                continue
            try:
                await self.thread.call(self.run, [item])
            except Exception as exc:
                fail(waiter, exc)
            else:
                answer(waiter, None)


class _BatchFailed(Exception):
    """A batch's error, with the calls it was for (raised on the model thread)."""

    def __init__(self, taken: list[tuple[Any, asyncio.Future[None]]], error: Exception) -> None:
        super().__init__(str(error))
        self.taken = taken
        self.error = error
