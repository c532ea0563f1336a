"""Owned tasks: the one way Parley stops a task it started.

Every task has an owner that cancels it and waits for it to end. Where a scope exists, the
owner is an `asyncio.TaskGroup`. Where none can exist (a task that outlives the call that
started it: a connection's reader, a worker's reply pump, a task an async generator starts
and must stop across `yield`s, which a TaskGroup cannot span), the owner keeps the task and
ends it with `cancel_and_wait`. This module sits in `pipeline`, the lowest package, so that
every other package can use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger("parley.tasks")


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
