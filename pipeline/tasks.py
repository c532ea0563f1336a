"""Owned tasks: the one way Parley stops a task it started.

Every task has an owner that cancels it and waits for it to end. Where a scope exists, the
owner is an `asyncio.TaskGroup`. Where none can exist (a task that outlives the call that
started it: a connection's reader, a worker's reply pump, a task an async generator starts
and must stop across `yield`s, which a TaskGroup cannot span), the owner keeps the task and
ends it with `cancel_and_wait`, or holds it in a `TaskSet` that does so on `close()`. Only
this module calls `asyncio.create_task`: everything else starts a task on a TaskGroup or a
TaskSet, or as a `background` watch (tests/test_task_ownership.py checks it). This module
sits in `pipeline`, the lowest package, so that every other package can use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, Self, TypeVar

log = logging.getLogger("parley.tasks")

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Task[object] | None) -> None:
    """Cancel `tasks` (None and finished ones are skipped) and wait until every one has
    ended. Their outcomes (a result, the cancellation, an error) are retrieved and dropped:
    the owner is stopping them, so nothing they had to say is wanted any more. If the caller
    is itself cancelled meanwhile, the tasks are still awaited before that cancellation
    propagates, so nothing is left running behind an owner that has gone."""
    await cancel_all(task for task in tasks if task is not None)


async def cancel_all(tasks: Iterable[asyncio.Task[object]]) -> None:
    """`cancel_and_wait` for a collection."""
    owned = list(tasks)
    for task in owned:
        task.cancel()
    pending = {task for task in owned if not task.done()}
    interrupted = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            interrupted = True  # the tasks end first; then the caller's cancellation goes on
    for task in owned:
        retrieve(task)
    if interrupted:
        raise asyncio.CancelledError


def retrieve(task: asyncio.Task[object]) -> None:
    """Mark a finished task's exception as retrieved (asyncio logs one never retrieved)."""
    if task.done() and not task.cancelled():
        task.exception()


def background(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task meant to run until its owner cancels it (a watch, an upkeep loop). If it
    ends with an error instead, the error is logged at once: `cancel_and_wait` would drop
    it at shutdown, and whatever the task kept going would have stopped without a word."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    log.error("task %s failed", task.get_name(), exc_info=task.exception())


class TaskSet:
    """The named owner of tasks that outlive the call that starts them: a connection's
    reader, a call's owner task, a batcher's dispatcher, a request handled beside a loop.

    What a TaskGroup gives a scope, this gives an object: it holds its tasks, forgets each
    as it ends, logs the failure of one nobody reads (an error would otherwise wait, unseen,
    for `close()` to drop it), and `close()` cancels and awaits every task still running.
    Unlike a TaskGroup, a failing task does not cancel the others and an error in the body of
    `async with` is raised as it is, not in an ExceptionGroup: the owner decides. `close()`
    is idempotent; once it has begun, starting a task raises RuntimeError (the owner is
    ending: what it would start has nobody to stop it). Used as `async with`, it closes at
    the block's end: a scope whose tasks must be stopped, not waited for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def create_task(
        self, coro: Coroutine[Any, Any, T], *, name: str | None = None, log_failure: bool = True
    ) -> asyncio.Task[T]:
        """Start `coro` as a task this set owns. `log_failure=False` where the caller awaits
        the task and reads its outcome itself (its error is no news to anyone)."""
        if self._closed:
            coro.close()  # never started: no "never awaited" warning
            raise RuntimeError(f"{self.name}: closed, no new tasks")
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if log_failure:
            task.add_done_callback(self._log_failure)
        return task

    def _log_failure(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("%s: task %s failed", self.name, task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        """How many of its tasks are still running."""
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    async def join(self) -> None:
        """Wait, cancelling nothing, until none of its tasks is running, those they start
        meanwhile included (an owner whose tasks end by themselves once told to)."""
        current = asyncio.current_task()
        while pending := [task for task in self._tasks if task is not current]:
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Start no more tasks; cancel the running ones and wait until every one has ended.
        Idempotent (a second call waits for whatever is still ending). Called from one of
        its own tasks, it stops the others and leaves that one to end by itself (a task
        cannot wait for its own end)."""
        self._closed = True
        current = asyncio.current_task()
        await cancel_all([task for task in self._tasks if task is not current])

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
