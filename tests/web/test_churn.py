"""Hundreds of short sessions over every transport leave the server as they found it:
no session, lease, task, Redis key, file descriptor or thread left, and memory flat."""

from __future__ import annotations

import asyncio
import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis.asyncio as aioredis

from loadtest.churn import Resources, churn
from sessions.process_beat import process_key
from tests.realtime.apps import served_app
from web.settings import Settings

RSS_SLACK_MB = 40.0
"""Allocator arenas and caches settle unevenly; a leak of a few hundred sessions is more."""
FD_SLACK = 6
"""The Redis client's pool keeps as many idle connections as were ever busy at once, which
varies a little from run to run; a leak of one descriptor per session would be hundreds."""


EXECUTOR_THREADS = 6
"""asyncio's default executor on this machine's two cores (min(32, cores + 4))."""


async def every_executor_thread_started() -> None:
    """The loop's default executor (getaddrinfo, `to_thread`) starts a thread only when all
    its threads are busy, and keeps it: a busier stretch of the churn than the warm-up would
    add threads that are no leak. Start them all before the baseline."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(EXECUTOR_THREADS, "churn-executor"))
    together = threading.Barrier(EXECUTOR_THREADS)
    waits = [loop.run_in_executor(None, together.wait, 5.0) for _ in range(EXECUTOR_THREADS)]
    await asyncio.gather(*waits)


async def settled(check: object, within_s: float = 10.0) -> None:
    assert callable(check)
    async with asyncio.timeout(within_s):
        while not check():
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_churn_returns_to_baseline(redis_url: str, redis: aioredis.Redis) -> None:
    await every_executor_thread_started()
    async with served_app(Settings(pipeline="echo", max_sessions=8), redis_url) as server:
        manager = server.services.manager
        assert manager is not None
        await churn(server.http_url, websocket=12, video=6, webrtc=3, concurrency=4)  # warm-up
        await settled(lambda: len(manager) == 0)
        gc.collect()
        await asyncio.sleep(0.5)
        tasks, before = len(asyncio.all_tasks()), Resources.of()

        # More sessions than the cap: a session held after its client left would refuse.
        await churn(server.http_url, websocket=200, video=60, webrtc=12, concurrency=4)

        await settled(lambda: len(manager) == 0)
        assert await manager.leases.count() == 0
        # what stays is the live process's heartbeat, nothing of any session or call (the
        # call index drops an ended call's key at its next sync, within half a second)
        baseline = [process_key(manager.process_id).encode()]
        async with asyncio.timeout(5):
            while (left := await redis.keys("*")) != baseline:
                await asyncio.sleep(0.1)
        assert left == baseline
        gc.collect()
        await settled(lambda: len(asyncio.all_tasks()) <= tasks)
        after = Resources.of()
        assert after.fds <= before.fds + FD_SLACK, (before, after)
        assert after.threads <= before.threads + 2, (before, after)
        assert after.rss_mb - before.rss_mb < RSS_SLACK_MB, (before, after)
