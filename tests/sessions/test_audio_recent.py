"""The input audio read from the buffer's in-memory copy gives what Redis holds."""

from __future__ import annotations

import numpy as np
import redis.asyncio as aioredis

from sessions.audio_buffer import AudioBuffer
from sessions.keys import SessionKeys


def frame(value: int) -> bytes:
    return np.full(320, value, dtype=np.int16).tobytes()


async def test_reads_from_memory_equal_reads_from_redis(redis: aioredis.Redis) -> None:
    keys = SessionKeys("sess_recent")
    local = AudioBuffer(redis, keys, max_seconds=60, batch_frames=7)
    remote = AudioBuffer(redis, keys, max_seconds=60, recent_seconds=0)  # Redis only
    try:
        for i in range(120):
            await local.append([frame(i)], 1000 + i * 20)
        ranges = [(1000, 1400), (990, 1050), (1013, 1100), (3000, 3400), (3300, 3500), (0, 500)]
        for start, end in ranges:
            mine = await local.read(start, end)
            assert np.array_equal(mine, await remote.read(start, end)), (start, end)
        assert local._recent_range(1000, 1400) is not None  # served from memory, in fact
        assert local._recent_range(3300, 3500) is None  # runs past the newest frame
        await local.clear()
        await local.append([frame(7)] * 3, 0)  # a new timeline after a clear
        assert np.all(await local.read(0, 60) == 7)
        assert len(await local.read(1000, 1400)) == 0
    finally:
        await redis.delete(*keys.all())


async def test_a_range_redis_trimmed_is_not_read_from_memory(redis: aioredis.Redis) -> None:
    keys = SessionKeys("sess_recent_cap")
    buf = AudioBuffer(redis, keys, max_seconds=1)  # 50 frames; the copy keeps 500
    try:
        for i in range(200):
            await buf.append([frame(i % 100)], i * 20)
        assert buf._recent_range(0, 400) is None
        assert buf._recent_range(3500, 4000) is not None
    finally:
        await redis.delete(*keys.all())
