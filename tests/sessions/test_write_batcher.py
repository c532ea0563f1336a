"""The process's Redis writes share pipelines: each write still gets exactly its own
results and errors, and a cancelled writer never leaves a write landing later."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from pipeline.tasks import cancel_and_wait
from sessions.errors import RedisUnavailableError
from sessions.write_batcher import Apply, WriteBatcher


@pytest.fixture
async def batcher(redis: aioredis.Redis) -> AsyncIterator[WriteBatcher]:
    writes = WriteBatcher(redis)
    task = asyncio.create_task(writes.run())
    await asyncio.sleep(0)
    yield writes
    await cancel_and_wait(task)
    await redis.delete(*[f"wb:{i}" for i in range(20)], "wb:list", "wb:string")


def incr(key: str, by: int = 1) -> list[Apply]:
    def apply(pipe: Pipeline) -> None:
        pipe.incrby(key, by)
        pipe.expire(key, 60)

    return [apply]


async def test_concurrent_writes_share_pipelines_and_get_their_own_results(
    batcher: WriteBatcher, redis: aioredis.Redis
) -> None:
    results = await asyncio.gather(*(batcher.execute(incr(f"wb:{i}", i)) for i in range(20)))
    assert [r[0] for r in results] == list(range(20))  # each its own INCRBY reply
    assert all(r[1] is True for r in results)  # ... and its own EXPIRE
    assert batcher.writes == 20
    assert batcher.pipelines < 20  # the writes that came together went together
    assert await redis.get("wb:7") == b"7"


async def test_a_refused_command_fails_only_its_own_write(
    batcher: WriteBatcher, redis: aioredis.Redis
) -> None:
    await redis.set("wb:string", "not a list")

    def wrong(pipe: Pipeline) -> None:
        pipe.lpush("wb:string", "x")  # WRONGTYPE

    outcomes: list[object] = await asyncio.gather(
        batcher.execute([wrong]),
        batcher.execute(incr("wb:1")),
        batcher.execute([wrong], raise_on_error=False),
        return_exceptions=True,
    )
    bad, good, lenient = outcomes
    assert isinstance(bad, ResponseError) and "WRONGTYPE" in str(bad)
    assert good == [1, True]
    assert isinstance(lenient, list) and isinstance(lenient[0], ResponseError)


async def test_a_cancelled_writer_never_has_its_write_land_afterwards(
    batcher: WriteBatcher, redis: aioredis.Redis
) -> None:
    slow_started = asyncio.Event()

    def blocking(pipe: Pipeline) -> None:
        slow_started.set()
        pipe.blpop(["wb:list"], timeout=0.2)  # holds the pipeline in flight for 0.2 s

    in_flight = asyncio.create_task(batcher.execute([blocking]))
    await slow_started.wait()
    queued = asyncio.create_task(batcher.execute(incr("wb:2")))  # waits for the next one
    riding = asyncio.create_task(batcher.execute(incr("wb:3")))
    await asyncio.sleep(0.05)
    queued.cancel()  # still queued: dropped, never sent
    with pytest.raises(asyncio.CancelledError):
        await queued
    await asyncio.sleep(0.2)
    assert await riding == [1, True]
    await in_flight
    # A writer cancelled while its pipeline is in flight returns only once it landed.
    landing = asyncio.create_task(batcher.execute(incr("wb:4") + [blocking]))
    await asyncio.sleep(0.05)
    landing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await landing
    assert await redis.get("wb:4") == b"1"  # landed before the cancel took
    assert await redis.get("wb:2") is None


async def test_writes_queued_when_the_writer_stops_fail_as_unavailable(
    redis: aioredis.Redis,
) -> None:
    writes = WriteBatcher(redis)
    task = asyncio.create_task(writes.run())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(writes.execute(incr("wb:5")))
    await asyncio.sleep(0)  # queued, the writer not yet woken
    await cancel_and_wait(task)
    with pytest.raises(RedisUnavailableError):
        await waiting
    # Without a running writer, writes go straight to Redis.
    assert await writes.execute(incr("wb:6")) == [1, True]
    await redis.delete("wb:5", "wb:6")
