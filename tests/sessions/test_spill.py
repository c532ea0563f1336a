"""The spill: a session's writes kept while Redis is unreachable, bounded, written back in
order. The outage is declared on the link here (no server is harmed); the real thing is in
test_redis_outage.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from pipeline.tasks import cancel_and_wait
from sessions.audio_buffer import AudioBuffer
from sessions.errors import RedisUnavailableError
from sessions.event_log import EventLog
from sessions.events import ConversationItem, SpeechStarted
from sessions.history import History
from sessions.keys import SessionKeys
from sessions.redis_link import RedisLink
from sessions.spill import Spill


async def written(log: EventLog, spill: Spill, count: int) -> None:
    """Let the log's writer task hand `count` recorded events to the spill."""
    writer = asyncio.create_task(log.run())
    try:
        async with asyncio.timeout(5):
            while len(spill.pending("events")) < count:
                await asyncio.sleep(0.01)
    finally:
        await cancel_and_wait(writer)


def frame(value: int) -> bytes:
    return np.full(320, value, dtype=np.int16).tobytes()


async def test_writes_during_an_outage_are_kept_readable_and_written_back_in_order(
    redis: aioredis.Redis,
) -> None:
    keys = SessionKeys("sess_spill")
    link = RedisLink(redis)
    spill = Spill(link)
    audio = AudioBuffer(redis, keys, max_seconds=10, spill=spill, recent_seconds=0, batch_frames=5)
    history = History(redis, keys, spill=spill)
    log = EventLog(redis, keys, spill=spill)
    try:
        await audio.append([frame(1)] * 5, 0)
        link.went_down(ConnectionError("test outage"))
        await audio.append([frame(2)] * 5, 100)
        await audio.append([frame(3)] * 5, 200)
        first = ConversationItem(role="user", text="said during the outage")
        assert await history.append(first) is None
        events = [SpeechStarted(audio_start_ms=i, item_id="item_x") for i in range(3)]
        for event in events:
            log.record(event)
        await written(log, spill, 3)
        assert (
            await redis.xlen(keys.audio) == 1
        )  # one 5-frame entry: nothing reached Redis meanwhile
        assert len(spill) == 4  # two audio writes, the history item, one event batch
        # A turn inside what was kept is read locally; one reaching back into Redis is not.
        assert np.all(await audio.read(100, 300) == np.repeat([2, 3], 5 * 320))
        try:
            await audio.read(0, 300)
        except RedisUnavailableError:
            pass
        else:
            raise AssertionError("read audio that only Redis holds while it was down")
        assert [i.text for i in await history.items()] == ["said during the outage"]

        link.came_back()
        await spill.settle()
        assert len(spill) == 0 and spill.bytes == 0
        assert np.all(await audio.read(0, 300) == np.repeat([1, 2, 3], 5 * 320))
        assert [e["event_id"] for e in await log.replay()] == [e.event_id for e in events]
        assert await redis.lrange(keys.history, 0, -1) == [first.id.encode()]
        assert link.stats.spilled == 4 and link.stats.restored == 4 and link.stats.dropped == 0
    finally:
        await redis.delete(*keys.all())


async def test_a_full_spill_drops_the_oldest_media_first_and_counts_it(
    redis: aioredis.Redis,
) -> None:
    keys = SessionKeys("sess_full")
    link = RedisLink(redis)
    spill = Spill(link, max_bytes=4 * 5 * 640)  # room for four 100 ms audio writes
    audio = AudioBuffer(redis, keys, max_seconds=10, spill=spill, batch_frames=5)
    log = EventLog(redis, keys, spill=spill)
    try:
        link.went_down(ConnectionError("test outage"))
        log.record(SpeechStarted(audio_start_ms=0, item_id="item_kept"))
        await written(log, spill, 1)
        for i in range(6):
            await audio.append([frame(i)] * 5, i * 100)
        assert spill.dropped == {"audio": 15}  # three writes of five frames
        assert spill.bytes <= spill.max_bytes
        assert link.stats.dropped == 3
        link.came_back()
        await spill.settle()
        # The event survived; the newest audio is there, the oldest is not.
        assert [e["item_id"] for e in await log.replay()] == ["item_kept"]
        assert np.all(await audio.read(300, 600) == np.repeat([3, 4, 5], 5 * 320))
        assert len(await audio.read(0, 300)) == 0
    finally:
        await redis.delete(*keys.all())


async def test_a_flush_whose_caller_is_cancelled_still_writes_its_frames(
    redis: aioredis.Redis,
) -> None:
    """A turn cancelled (a barge-in) while its audio read flushes the buffer: the frames
    taken for the write still land, in order, and the next ones after them."""
    keys = SessionKeys("sess_spill_cancel")
    link = RedisLink(redis)
    writer = asyncio.create_task(link.writes.run())
    await asyncio.sleep(0)
    spill = Spill(link)
    audio = AudioBuffer(redis, keys, max_seconds=60, batch_frames=1000, spill=spill)
    history = History(redis, keys, spill=spill)
    try:
        started = asyncio.Event()

        def blocking(pipe: Pipeline) -> None:
            started.set()
            pipe.blpop(["spill:nothing"], timeout=0.2)  # the batcher's pipeline in flight

        in_flight = asyncio.create_task(link.writes.execute([blocking]))
        await started.wait()
        await audio.append([frame(1)] * 5, 0)
        flushing = asyncio.create_task(audio.flush())  # queued behind the blocking one
        await asyncio.sleep(0.05)
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        await in_flight
        await audio.append([frame(2)] * 5, 100)
        assert await audio.length() == 10
        assert np.all(await audio.read(0, 200) == np.repeat([1, 2], 5 * 320))
        # A history write cancelled the same way lands once.
        in_flight = asyncio.create_task(link.writes.execute([blocking]))
        await started.wait()
        item = ConversationItem(type="message", role="user")
        appending = asyncio.create_task(history.append(item))
        await asyncio.sleep(0.05)
        appending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await appending
        await in_flight
        assert [i.id for i in await history.items()] == [item.id]
    finally:
        await cancel_and_wait(writer)
        await redis.delete(*keys.all())


async def test_a_cancel_is_held_back_only_for_a_while(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that cannot end (here: the spill's lock held) holds its cancelled caller
    back for `FINISH_WAIT_S` at most; then the cancel is delivered."""
    monkeypatch.setattr("sessions.spill.FINISH_WAIT_S", 0.2)
    keys = SessionKeys("sess_spill_stuck")
    spill = Spill(RedisLink(redis))
    audio = AudioBuffer(redis, keys, max_seconds=60, batch_frames=1000, spill=spill)
    async with spill._lock:
        await audio.append([frame(1)] * 5, 0)
        flushing = asyncio.create_task(audio.flush())
        await asyncio.sleep(0.05)
        flushing.cancel()
        async with asyncio.timeout(2):
            with pytest.raises(asyncio.CancelledError):
                await flushing
    try:
        async with asyncio.timeout(5):  # the write goes on alone once the lock is free
            while await redis.xlen(keys.audio) == 0:
                await asyncio.sleep(0.01)
        assert await audio.length() == 5
    finally:
        await redis.delete(*keys.all())
