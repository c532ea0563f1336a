"""cancel_and_wait: tasks end before it returns, even when its caller is cancelled; a
background task that fails is logged at once; a TaskSet holds its tasks until they end and
stops the rest on close."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.tasks import TaskSet, background, cancel_and_wait


async def test_every_task_has_ended_and_errors_are_retrieved() -> None:
    ended: list[str] = []

    async def sleeper(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.01)  # clean-up that takes a moment
            ended.append(name)

    async def failing() -> None:
        raise RuntimeError("boom")

    a, b, c = (
        asyncio.create_task(sleeper("a")),
        asyncio.create_task(sleeper("b")),
        asyncio.create_task(failing()),
    )
    await asyncio.sleep(0)
    await cancel_and_wait(a, None, b, c)
    assert sorted(ended) == ["a", "b"] and a.done() and b.done() and c.done()
    await cancel_and_wait(a)  # finished tasks: nothing to do


async def test_a_cancelled_caller_still_waits_for_its_tasks() -> None:
    finished = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.05)
            finished.set()

    async def owner() -> None:
        child = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        await cancel_and_wait(child)

    task = asyncio.create_task(owner())
    await asyncio.sleep(0.01)
    task.cancel()  # while it waits for its child
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()


async def test_a_background_task_that_fails_is_logged_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def watch() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("the slot map")

    async def forever() -> None:
        await asyncio.Event().wait()

    failing = background(watch(), "redis-link")
    quiet = background(forever(), "upkeep")
    await asyncio.wait({failing})
    await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    failures = [r for r in caplog.records if r.name == "parley.tasks"]
    assert [r.getMessage() for r in failures] == ["task redis-link failed"]
    assert failures[0].exc_info is not None and "the slot map" in str(failures[0].exc_info[1])
    await cancel_and_wait(failing, quiet)  # cancelled by its owner: nothing more logged
    assert len([r for r in caplog.records if r.name == "parley.tasks"]) == 1


async def test_a_task_set_stops_what_runs_and_logs_what_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ended: list[str] = []

    async def sleeper() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # clean-up that takes a moment
            ended.append("sleeper")

    async def failing() -> None:
        raise RuntimeError("boom")

    async def read_by_its_caller() -> None:
        raise ValueError("the caller's to report")

    tasks = TaskSet("calls")
    sleeping = tasks.create_task(sleeper(), name="sleeper")
    tasks.create_task(failing(), name="failing")
    read = tasks.create_task(read_by_its_caller(), log_failure=False)
    with pytest.raises(ValueError, match="the caller's to report"):
        await read
    await asyncio.sleep(0.01)
    assert len(tasks) == 1  # the ended ones are forgotten
    failures = [r.getMessage() for r in caplog.records if r.name == "parley.tasks"]
    assert failures == ["calls: task failing failed"]
    await tasks.close()
    assert ended == ["sleeper"] and sleeping.cancelled() and len(tasks) == 0
    await tasks.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        tasks.create_task(sleeper())  # an owner that has ended starts nothing


async def test_a_task_set_as_a_scope_stops_its_tasks_and_lets_errors_through() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    owned: list[asyncio.Task[None]] = []

    async def scope() -> None:
        async with TaskSet("scope") as tasks:
            owned.append(tasks.create_task(forever()))
            await started.wait()
            raise KeyError("body")

    with pytest.raises(KeyError):  # as it is, not in an ExceptionGroup
        await scope()
    assert owned[0].cancelled()


async def test_a_task_set_joined_waits_for_tasks_started_meanwhile() -> None:
    ended: list[str] = []
    tasks = TaskSet("handlers")

    async def second() -> None:
        await asyncio.sleep(0.02)
        ended.append("second")

    async def first() -> None:
        await asyncio.sleep(0.01)
        tasks.create_task(second())  # started while the owner already waits
        ended.append("first")

    tasks.create_task(first())
    await tasks.join()
    assert ended == ["first", "second"] and len(tasks) == 0
    await tasks.close()
