"""Redis at its memory limit (`maxmemory`, `noeviction`): it answers, reads included, but
refuses writes with OOM. A real redis-server of the test's own is filled to its limit (a
tight `maxmemory` and a key bigger than the room left), then freed (the filler deleted).
Writes refused meanwhile are kept, counted and written back; the calls go on; each client
hears of it once, and once more only if kept writes had to be dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
import redis.asyncio as aioredis

from pipeline.engine_pipeline import EnginePipeline
from pipeline.tasks import cancel_and_wait
from sessions.audio_buffer import AudioBuffer
from sessions.config import VideoConfig
from sessions.errors import SessionLimitError
from sessions.events import ConversationItem, ErrorEvent, ResponseDone
from sessions.frame_cache import FrameCache
from sessions.history import History
from sessions.keys import SessionKeys
from sessions.manager import SessionManager
from sessions.metrics import SessionMetrics
from sessions.redis_link import RedisLink
from sessions.session import SessionLimits
from sessions.spill import Spill
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink
from tests.metrics import metric_value
from tests.redis_process import FILLER, RedisProcess, fill, free

from .conftest import feed
from .test_buffers import jpeg
from .test_redis_outage import (
    check_replay_holds,
    fast_link,
    listening,
    parley_records,
    speech,
    wait_after,
)


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisProcess]:
    """One server for the module (a start takes a while on a busy machine); each test
    leaves it as it found it (the `client` fixture)."""
    server = RedisProcess()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def client(own_redis: RedisProcess) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis(unix_socket_path=str(own_redis.socket), socket_timeout=1.0)
    try:
        yield redis
    finally:
        await redis.config_set("maxmemory", 0)
        await redis.flushall()
        await redis.aclose()


def frame(value: int) -> bytes:
    return np.full(320, value, dtype=np.int16).tobytes()


def refusals(metrics: SessionMetrics) -> float:
    return metric_value(metrics.redis_write_refusals.labels("oom"))


async def takes_writes_again(manager: SessionManager) -> None:
    """Wait until the manager's link has seen Redis take a write again."""
    async with asyncio.timeout(20):
        while metric_value(manager.metrics.redis_accepts_writes) != 1:
            await asyncio.sleep(0.05)


def errors(sink: ClockedSink, code: str) -> list[ErrorEvent]:
    return [e for e in sink.events if isinstance(e, ErrorEvent) and e.code == code]


async def test_refused_writes_are_kept_readable_and_written_back_once_redis_takes_writes(
    client: aioredis.Redis,
) -> None:
    keys = SessionKeys("sess_oom")
    link = RedisLink(client, call_timeout_s=0.5, probe_interval_s=0.05)
    metrics = SessionMetrics()
    spill = Spill(link, metrics=metrics)
    audio = AudioBuffer(client, keys, max_seconds=10, spill=spill, recent_seconds=0, batch_frames=5)
    history = History(client, keys, spill=spill)
    before = ConversationItem(role="user", text="before")
    await audio.append([frame(1)] * 5, 0)
    await history.append(before)

    await fill(client)
    await audio.append([frame(2)] * 5, 100)  # refused: kept, and the refusal begins
    assert link.up and link.refusing and link.refusals == 1
    await audio.append([frame(3)] * 5, 200)  # kept without asking Redis
    during = ConversationItem(role="user", text="during")
    await history.append(during)
    assert len(spill) == 3
    assert refusals(metrics) == 1
    assert metric_value(metrics.redis_spilled_writes) == 3
    # Reads go on: Redis answers them, and what it lacks is read from what is kept.
    assert np.all(await audio.read(0, 300) == np.repeat([1, 2, 3], 5 * 320))
    assert await client.lrange(keys.history, 0, -1) == [before.id.encode()]
    assert [i.text for i in await history.items()] == ["before", "during"]

    # A write back that meets the limit again stops there and belongs to the same refusal.
    link.accepts_writes()
    await spill.settle()
    assert link.refusing and link.refusals == 1 and len(spill) == 3
    assert refusals(metrics) == 2

    await free(client)
    watch = asyncio.create_task(link.run())
    try:
        async with asyncio.timeout(5):
            await link.wait_writable()  # the write probe was taken
    finally:
        await cancel_and_wait(watch)
    await spill.settle()
    assert len(spill) == 0 and spill.bytes == 0
    assert np.all(await audio.read(0, 300) == np.repeat([1, 2, 3], 5 * 320))
    assert await client.xlen(keys.audio) == 3
    assert await client.lrange(keys.history, 0, -1) == [before.id.encode(), during.id.encode()]
    assert link.stats.restored == 3 and link.stats.dropped == 0
    await client.delete(*keys.all())
    assert await client.keys("*") == []  # the write probe wrote nothing


async def test_a_turn_samples_the_stored_frames_and_those_kept_while_redis_is_full(
    client: aioredis.Redis,
) -> None:
    keys = SessionKeys("sess_oom_frames")
    link = RedisLink(client)
    spill = Spill(link)
    cache = FrameCache(client, keys, VideoConfig(max_frames=3, frame_filter=False), spill=spill)
    try:
        for t in (0, 1):
            await cache.add(jpeg((t * 100, 0, 0)), t)
        await fill(client)
        for t in (2, 3):
            await cache.add(jpeg((t * 60, 0, 0)), t)
        assert link.refusing and len(spill) == 2
        # Redis holds 0 and 1, 2 and 3 are kept: the newest three are 1, 2, 3.
        assert await cache.count() == 3
        assert [f.timestamp_ms for f in await cache.sample(3, "uniform")] == [1, 2, 3]
        assert [f.timestamp_ms for f in await cache.sample(1, "latest")] == [3]
        await cache.clear()  # kept too: Redis cannot say what is left until it is written
        assert await cache.count() == 0 and await cache.sample(2) == []
    finally:
        await free(client)
        await client.delete(*keys.all())


async def test_a_call_goes_on_while_redis_is_full_and_its_writes_land_when_memory_is_freed(
    client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="parley")
    limits = SessionLimits(watchdog_interval_s=0.05)
    manager = SessionManager(
        client, EnginePipeline(FakeEngine(audio_ms=300)), limits=limits, link=fast_link(client)
    )
    async with manager:
        sinks = [await ClockedSink().__aenter__() for _ in range(2)]
        try:
            sessions = [await manager.create(sink) for sink in sinks]
            for sink in sinks:
                await sink.wait_for(lambda e: e.type == "session.created")
            await asyncio.gather(*(feed(s, speech("Hello, can you hear me?")) for s in sessions))
            for sink in sinks:
                done = await sink.wait_for(lambda e: isinstance(e, ResponseDone))
                await wait_after(sink, sink.events.index(done), listening)

            await fill(client)
            marks = [len(sink.events) for sink in sinks]
            question = speech("What is the weather like in Paris today?")
            await asyncio.gather(*(feed(s, question) for s in sessions))
            for session, sink, mark in zip(sessions, sinks, marks, strict=True):
                done = await wait_after(sink, mark, lambda e: isinstance(e, ResponseDone))
                assert isinstance(done, ResponseDone) and done.status == "completed", done
                assert not session.closed
                assert len(session.spill) > 0
            assert refusals(manager.metrics) >= 1
            assert metric_value(manager.metrics.redis_accepts_writes) == 0
            assert metric_value(manager.metrics.redis_up) == 1  # reachable all along
            with pytest.raises(SessionLimitError, match="full"):
                await manager.create(ClockedSink())
            # Reads go on: the resume log still holds what came before.
            assert len(await sessions[0].event_log.replay()) > 0

            await free(client)
            await takes_writes_again(manager)
            for session, sink in zip(sessions, sinks, strict=True):
                assert len(session.spill) == 0
                await check_replay_holds(session, sink, 0)  # the whole log: nothing lost
                fed_ms = session.describe()["input_audio_ms"]
                assert await session.audio.length() == fed_ms // 20
                items = await session.history.items()
                assert len(items) == 4  # two turns, two answers
                assert await client.hlen(session.keys.items) == len(items)
                assert await client.llen(session.keys.history) == len(items)
                (told,) = errors(sink, "redis_full")
                assert told.error_type == "server_error" and "full" in told.message
                assert errors(sink, "redis_unavailable") == []
                assert errors(sink, "redis_writes_dropped") == []

            warnings = parley_records(caplog, logging.WARNING)
            assert [r.name for r in warnings] == ["parley.sessions.redis"], warnings
            assert "refuses writes, out of memory" in warnings[0].getMessage()
            lines = [r.getMessage() for r in caplog.records]
            back = [line for line in lines if "Redis accepts writes again" in line]
            assert len(back) == 1 and "2 live sessions" in back[0] and "0 dropped" in back[0]

            # And the next turn works as before.
            marks = [len(sink.events) for sink in sinks]
            await asyncio.gather(*(feed(s, speech("Thank you.")) for s in sessions))
            for sink, mark in zip(sinks, marks, strict=True):
                done = await wait_after(sink, mark, lambda e: isinstance(e, ResponseDone))
                assert isinstance(done, ResponseDone) and done.status == "completed"
        finally:
            await manager.close()
            for sink in sinks:
                await sink.__aexit__(None, None, None)
    assert await client.keys("*") == []


async def test_the_client_is_told_once_more_when_kept_writes_are_dropped(
    client: aioredis.Redis,
) -> None:
    """A spill of 64 kB (2 s of input audio) and 4 s spoken while Redis is full: the oldest
    audio goes, the client hears of it once, the items still land."""
    limits = SessionLimits(watchdog_interval_s=0.05, spill_max_bytes=64 * 1024)
    manager = SessionManager(
        client, EnginePipeline(FakeEngine(audio_ms=300)), limits=limits, link=fast_link(client)
    )
    async with manager:
        sink = await ClockedSink().__aenter__()
        try:
            session = await manager.create(sink, {"turn_detection": None})
            await sink.wait_for(lambda e: e.type == "session.created")
            await fill(client)
            await feed(session, speech("One, two, three, four, five, six, seven."))
            await feed(session, speech("Eight, nine, ten."))
            await session.add_text("typed while Redis was full")
            (_full,) = errors(sink, "redis_full")
            (lost,) = errors(sink, "redis_writes_dropped")
            assert "input audio" in lost.message
            dropped = manager.metrics.redis_spill_dropped.labels("audio")
            assert metric_value(dropped) > 0

            await free(client)
            await takes_writes_again(manager)
            assert await client.llen(session.keys.history) == 1
            assert len(errors(sink, "redis_writes_dropped")) == 1
        finally:
            await manager.close()
            await sink.__aexit__(None, None, None)
    assert await client.keys("*") == []


async def test_a_session_is_refused_with_the_reason_while_redis_is_full(
    client: aioredis.Redis,
) -> None:
    """The lease script gets in at the limit (its first write deletes), the ownership claim
    does not: the lease is given back and the client is told why; nothing is left."""
    manager = SessionManager(client, EnginePipeline(FakeEngine()), link=fast_link(client))
    async with manager:
        await fill(client)
        with pytest.raises(SessionLimitError, match="full"):
            await manager.create(ClockedSink())
        assert manager.link.refusing
        assert await manager.leases.count() == 0
        assert refusals(manager.metrics) == 1
        await free(client)
        await takes_writes_again(manager)
        assert not manager.link.refusing
    assert await client.keys("*") == []


async def test_sessions_that_end_while_redis_is_full_leave_no_keys_and_no_lease(
    client: aioredis.Redis,
) -> None:
    """Deleting is no write Redis refuses at its limit: the keys and leases go at once, and
    what was kept is dropped with them."""
    manager = SessionManager(client, EnginePipeline(FakeEngine()), link=fast_link(client))
    async with manager:
        sink = await ClockedSink().__aenter__()
        try:
            session = await manager.create(sink, {"turn_detection": None})
            await sink.wait_for(lambda e: e.type == "session.created")
            await fill(client)
            await feed(session, speech("Goodbye."))
            await session.add_text("typed while Redis was full")
            assert len(session.spill) > 0
            await manager.close_session(session.session_id)
            assert await manager.leases.count() == 0
            assert await client.keys(f"*{session.session_id}*") == []
        finally:
            await manager.close()
            await sink.__aexit__(None, None, None)
    assert await client.keys("*") == [FILLER.encode()]
    await free(client)
