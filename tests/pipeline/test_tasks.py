"""cancel_and_wait: tasks end before it returns, even when its caller is cancelled; a
background task that fails is logged at once."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.tasks import background, cancel_and_wait


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
