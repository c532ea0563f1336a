"""The step batcher: steps asked for together run together; a step whose asker has gone
never runs; closing fails whatever still waits; when more wait than a batch takes, those due
first run first (a playback deadline), and steps without deadlines first come, first served."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from pipeline.device_faults import DeviceLost
from pipeline.engines.qwen3_omni import step_batcher
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


async def _order_of_waiting_steps(
    steps: list[tuple[str, float | None]], clock: list[float]
) -> tuple[list[str], int]:
    """Hold the model thread with a first step, queue `steps` (name, deadline) with the clock
    at 0, 1, 2, ..., then let them run in batches of one: the order they ran, the overtakes."""
    thread = ModelThread("test-batcher-deadline")
    thread.start()
    ran: list[str] = []
    gate = threading.Event()

    def run(items: list[str]) -> list[str]:
        if items == ["hold"]:
            gate.wait(5)
        else:
            ran.extend(items)
        return items

    batcher: StepBatcher[str, str] = StepBatcher(
        "test", thread, run, max_batch=1, clock=lambda: clock[0]
    )
    batcher.start()
    try:
        holding = asyncio.create_task(batcher.step("hold"))
        await asyncio.sleep(0.05)  # running, held at the gate
        waiting = []
        for name, deadline in steps:
            waiting.append(asyncio.create_task(batcher.step(name, deadline)))
            await asyncio.sleep(0)  # asked for in this order
            clock[0] += 1.0
        gate.set()
        async with asyncio.timeout(10):
            await asyncio.gather(holding, *waiting)
        return ran, batcher.overtakes
    finally:
        await batcher.close()
        await thread.close()


async def test_the_step_due_first_runs_first_and_steps_without_deadlines_keep_order() -> None:
    # asked at 0, 1, 2, 3, 4, 5: "none" steps are due when asked
    steps: list[tuple[str, float | None]] = [
        ("ahead", 9.0), ("none1", None), ("behind", 0.5), ("none2", None), ("soon", 2.5),
        ("late", 8.0),
    ]  # fmt: skip
    ran, overtakes = await _order_of_waiting_steps(steps, [0.0])
    assert ran == ["behind", "none1", "soon", "none2", "late", "ahead"]
    assert overtakes == 5  # every step but "ahead" ran before it, though asked for after it

    fifo, overtakes = await _order_of_waiting_steps([(n, None) for n in "abcde"], [0.0])
    assert fifo == list("abcde") and overtakes == 0


async def test_a_busy_batcher_reports_its_batches(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under load a stage says how full its steps were and how long each held the thread."""
    monkeypatch.setattr(step_batcher, "REPORT_S", 0.0)
    thread = ModelThread("test-batcher-tally")
    thread.start()
    batcher: StepBatcher[int, int] = StepBatcher("tallied", thread, lambda xs: xs, max_batch=4)
    batcher.start()
    try:
        with caplog.at_level(logging.INFO, logger="parley.pipeline.qwen3_omni"):
            async with asyncio.timeout(10):
                assert await asyncio.gather(*(batcher.step(i) for i in range(3))) == [0, 1, 2]
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tallied:")]
        assert lines and "3.0 steps each (largest 3)" in lines[0]
        assert "ms each on the model thread" in lines[0] and "waiting for it" in lines[0]
    finally:
        await batcher.close()
        await thread.close()


async def test_one_bad_step_fails_alone_and_the_rest_of_its_batch_is_answered() -> None:
    thread = ModelThread("test-batcher-bad")
    thread.start()
    gate = threading.Event()
    calls: list[list[str]] = []

    def run(items: list[str]) -> list[str]:
        gate.wait(5)  # the first step holds the thread while the others gather
        calls.append(items)
        if "bad" in items:
            raise ValueError("a shape this code did not expect")
        return [item.upper() for item in items]

    batcher: StepBatcher[str, str] = StepBatcher("test", thread, run, max_batch=8)
    batcher.start()
    try:
        first = asyncio.create_task(batcher.step("first"))
        await asyncio.sleep(0.05)
        asked = [asyncio.create_task(batcher.step(item)) for item in ("a", "b", "bad", "c", "d")]
        await asyncio.sleep(0.05)
        gate.set()
        async with asyncio.timeout(10):
            answers = await asyncio.gather(first, *asked, return_exceptions=True)
        assert answers[0] == "FIRST"
        assert [answers[1], answers[2], answers[4], answers[5]] == ["A", "B", "C", "D"]
        assert isinstance(answers[3], ValueError)
        assert calls[1] == ["a", "b", "bad", "c", "d"]  # one batch, then the halves
        assert batcher.isolated == 1
        assert sum(1 for call in calls if call == ["bad"]) == 1
        assert len(calls) <= 2 + 2 * 3  # halves, not one call per step
    finally:
        await batcher.close()
        await thread.close()


async def test_a_sticky_device_error_fails_the_whole_batch_and_every_later_step() -> None:
    thread = ModelThread("test-batcher-sticky")
    thread.start()
    gate = threading.Event()
    calls: list[list[str]] = []

    def run(items: list[str]) -> list[str]:
        gate.wait(5)
        calls.append(items)
        if "bad" in items:  # what torch raises after an out-of-bounds index on the GPU
            raise RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors...")
        return items

    batcher: StepBatcher[str, str] = StepBatcher("test", thread, run, max_batch=8)
    batcher.start()
    try:
        first = asyncio.create_task(batcher.step("first"))
        await asyncio.sleep(0.05)
        asked = [asyncio.create_task(batcher.step(item)) for item in ("a", "bad", "c")]
        await asyncio.sleep(0.05)
        gate.set()
        async with asyncio.timeout(10):
            answers = await asyncio.gather(*asked, return_exceptions=True)
        assert await first == "first"
        assert all(isinstance(answer, RuntimeError) for answer in answers)
        assert calls[1:] == [["a", "bad", "c"]]  # not run again: the device is gone
        assert thread.fatal is not None and "device-side assert" in thread.fatal
        with pytest.raises(DeviceLost, match="device-side assert"):
            await batcher.step("later")
        assert len(calls) == 2
    finally:
        await batcher.close()
        await thread.close()
