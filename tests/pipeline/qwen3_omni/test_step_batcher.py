"""The step batcher: steps asked for together run together; a step whose asker has gone
never runs; closing fails whatever still waits."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.engines.qwen3_omni.model_thread import ModelThread
from pipeline.engines.qwen3_omni.step_batcher import StepBatcher


async def test_members_in_step_share_batches_and_a_cancelled_step_is_dropped() -> None:
    thread = ModelThread("test-batcher")
    thread.start()
    batches: list[list[str]] = []
    gate = threading.Event()

    def run(items: list[str]) -> list[str]:
        gate.wait(5)  # hold the model thread while the next steps gather
        batches.append(items)
        return [item.upper() for item in items]

    batcher: StepBatcher[str, str] = StepBatcher("test", thread, run, max_batch=3)
    batcher.start()
    try:

        async def member(name: str, steps: int) -> list[str]:
            with batcher.member():
                return [await batcher.step(f"{name}{i}") for i in range(steps)]

        first = asyncio.create_task(member("a", 3))
        await asyncio.sleep(0.05)  # a0 runs alone, held at the gate
        others = [asyncio.create_task(member(n, 3)) for n in "bcd"]
        doomed = asyncio.create_task(batcher.step("x"))
        await asyncio.sleep(0.05)
        doomed.cancel()
        gate.set()
        async with asyncio.timeout(10):
            results = await asyncio.gather(first, *others)
        assert results[0] == ["A0", "A1", "A2"] and results[3] == ["D0", "D1", "D2"]
        assert batches[0] == ["a0"]
        assert all(len(batch) <= 3 for batch in batches)
        assert max(len(batch) for batch in batches) == 3
        assert not any("x" in item for batch in batches for item in batch)
    finally:
        await batcher.close()
        await thread.close()


async def test_closing_fails_the_steps_still_waiting() -> None:
    thread = ModelThread("test-batcher-close")
    thread.start()
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    batcher: StepBatcher[int, int] = StepBatcher("test", thread, run, max_batch=1)
    batcher.start()
    running = asyncio.create_task(batcher.step(1))
    waiting = asyncio.create_task(batcher.step(2))
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0.05)
    gate.set()
    await closing
    await batcher.close()  # idempotent
    for step in (running, waiting):  # mid-batch or still queued: told, not left waiting
        with pytest.raises(RuntimeError, match="closed"):
            await step
    await thread.close()
    with pytest.raises(RuntimeError, match="not running"):
        await batcher.step(3)
