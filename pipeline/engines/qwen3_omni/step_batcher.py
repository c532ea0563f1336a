"""Continuous batching: the decode steps that requests ask for run together, one forward each.

Each request's generator asks for its next step and waits; one dispatcher task takes every
step asked for (up to `max_batch`) and runs them as one batched call on the model thread.
A request joins the batch at its first step after its prefill and leaves it when it ends or
is aborted; nobody waits for a batch to fill. While a batch runs, the steps of the next one
gather. Requests in their decode phase say so (`member()`), and before each batch the
dispatcher gives the members a moment (`regroup_s`) to ask for their next step: without it,
two requests whose prefills ended at different times would alternate in batches of one
forever. A step whose waiter has gone (cancelled, aborted) is dropped before it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ...tasks import cancel_and_wait
from .model_thread import ModelThread

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class StepBatcher(Generic[ItemT, ResultT]):
    def __init__(
        self,
        name: str,
        thread: ModelThread,
        run: Callable[[list[ItemT]], list[ResultT]],
        *,
        max_batch: int = 8,
        regroup_s: float = 0.002,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.name = name
        self.thread = thread
        self.run = run
        self.max_batch = max_batch
        self.regroup_s = regroup_s
        self.largest_batch = 0
        """The most steps one batch has run (for tests and metrics)."""
        self._queue: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._members = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._dispatch(), name=f"{self.name}:batcher")

    async def close(self) -> None:
        """Stop dispatching; steps still waiting fail. Idempotent."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for _, waiter in self._queue:
            if not waiter.done():
                waiter.set_exception(RuntimeError(f"{self.name} is closed"))
        self._queue.clear()

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """Around a request's decode loop: the dispatcher waits a moment for its steps."""
        self._members += 1
        try:
            yield
        finally:
            self._members -= 1
            self._arrived.set()  # a regroup waiting for it need not wait any more

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """Inside `member()`, while the request waits for something else (its input): the
        dispatcher does not wait for its step meanwhile."""
        self._members -= 1
        self._arrived.set()
        try:
            yield
        finally:
            self._members += 1

    async def step(self, item: ItemT) -> ResultT:
        if self._task is None:
            raise RuntimeError(f"{self.name} is not running")
        waiter: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._queue.append((item, waiter))
        self._arrived.set()
        return await waiter

    async def _dispatch(self) -> None:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            await self._regroup()
            taken, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            batch = [(item, waiter) for item, waiter in taken if not waiter.done()]
            if not batch:
                continue
            self.largest_batch = max(self.largest_batch, len(batch))
            try:
                results = await self.thread.call(self.run, [item for item, _ in batch])
            except asyncio.CancelledError:
                for _, waiter in batch:  # closed mid-batch: nobody will answer them now
                    if not waiter.done():
                        waiter.set_exception(RuntimeError(f"{self.name} is closed"))
                raise
            except Exception as exc:
                for _, waiter in batch:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            for (_, waiter), result in zip(batch, results, strict=True):
                if not waiter.done():
                    waiter.set_result(result)

    async def _regroup(self) -> None:
        """Wait up to `regroup_s` until every member has asked for its step."""
        if len(self._queue) >= min(self._members, self.max_batch):
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.regroup_s):
                while len(self._queue) < min(self._members, self.max_batch):
                    self._arrived.clear()
                    await self._arrived.wait()
