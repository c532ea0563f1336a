"""Guards for behaviour of our dependencies that the session core relies on."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis


async def test_cancelling_a_redis_pipeline_call_ends_the_task(redis: aioredis.Redis) -> None:
    """redis-py 8.x swallows the CancelledError inside pipeline.execute(); a session's
    writer task then never ends on close. This is why pyproject pins redis<8."""

    async def write_forever() -> None:
        while True:
            pipe = redis.pipeline(transaction=False)
            for _ in range(20):
                pipe.xadd("parley:test:cancel", {"e": "x" * 200}, maxlen=100, approximate=True)
            await pipe.execute()

    try:
        for attempt in range(100):
            task = asyncio.create_task(write_forever())
            await asyncio.sleep(0.001 * (attempt % 7))
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            assert done, "a cancelled Redis call did not end its task"
    finally:
        await redis.delete("parley:test:cancel")
