"""RedisLink.call delivers a cancel that the Redis client swallowed.

On Python 3.11, redis-py wraps each socket write in `asyncio.wait_for`, which returns the
write's result instead of raising when a cancel lands just as the write completes. A
session that cancels its event-log writer at that moment then waited forever in `close()`,
holding its session slot until shutdown (issue 8: a WebRTC call closed right after it was
set up). The link re-raises such a cancel once the call returns.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis

from sessions.redis_link import RedisLink


async def test_a_cancel_the_client_swallowed_still_cancels_the_caller(
    redis: aioredis.Redis,
) -> None:
    link = RedisLink(redis)
    started = asyncio.Event()

    async def swallowing_call() -> str:
        started.set()
        # What wait_for does when its inner future is already done:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return "written"

    task = asyncio.create_task(link.call(swallowing_call))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_returns_its_result(redis: aioredis.Redis) -> None:
    link = RedisLink(redis)
    assert await link.call(lambda: redis.ping()) is True
