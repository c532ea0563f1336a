"""Gathered calls: those asked for while the model thread is busy run as one batch; a batch
that fails is run again call by call, so that only the bad call fails."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.engines.qwen3_omni.gathered_calls import GatheredCalls
from pipeline.engines.qwen3_omni.model_thread import ModelThread


async def test_calls_waiting_for_the_thread_run_as_one_batch_and_a_bad_one_fails_alone() -> None:
    thread = ModelThread("test-gathered")
    thread.start()
    batches: list[list[str]] = []
    done: list[str] = []

    def run(items: list[str]) -> None:
        batches.append(list(items))
        if "bad" in items:
            raise ValueError("cannot take 'bad'")
        done.extend(items)

    gathered: GatheredCalls[str] = GatheredCalls("test", thread, run, max_batch=3)
    gathered.start()
    gate = threading.Event()
    try:
        busy = asyncio.ensure_future(thread.call(gate.wait, 5))  # the thread is busy...
        calls = [asyncio.ensure_future(gathered.call(item)) for item in ("a", "b", "c", "d")]
        await asyncio.sleep(0.05)
        gate.set()  # ...and when it is free, the calls waiting go as one (up to max_batch)
        async with asyncio.timeout(10):
            await busy
            await asyncio.gather(*calls)
        assert batches[0] == ["a", "b", "c"] and batches[1] == ["d"]
        assert gathered.largest_batch == 3

        batches.clear()
        gate.clear()
        busy = asyncio.ensure_future(thread.call(gate.wait, 5))
        good = asyncio.ensure_future(gathered.call("e"))
        bad = asyncio.ensure_future(gathered.call("bad"))
        await asyncio.sleep(0.05)
        gate.set()
        async with asyncio.timeout(10):
            await busy
            await good  # the batch failed, then "e" went alone and was done
            with pytest.raises(ValueError, match="cannot take 'bad'"):
                await bad
        assert batches == [["e", "bad"], ["e"], ["bad"]]
        assert done[-1] == "e"
    finally:
        await gathered.close()
        await gathered.close()  # idempotent
        await thread.close()


async def test_after_a_sticky_device_error_every_call_fails_and_none_waits() -> None:
    thread = ModelThread("test-gathered-sticky")
    thread.start()

    def run(items: list[int]) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    gathered: GatheredCalls[int] = GatheredCalls("test", thread, run)
    gathered.start()
    try:
        async with asyncio.timeout(5):
            results = await asyncio.gather(
                *(gathered.call(i) for i in range(3)), return_exceptions=True
            )
            assert all(isinstance(result, RuntimeError) for result in results)
            assert thread.fatal is not None and "illegal memory access" in thread.fatal
            with pytest.raises(RuntimeError, match="the device failed earlier"):
                await gathered.call(9)
    finally:
        await gathered.close()
        await thread.close()
