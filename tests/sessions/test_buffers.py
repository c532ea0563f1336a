"""The Redis buffers of a session: caps, TTLs, eviction, sampling, isolation."""

from __future__ import annotations

import io

import numpy as np
import pytest
import redis.asyncio as aioredis
from PIL import Image

from pipeline.tasks import cancel_and_wait
from sessions.audio_buffer import AudioBuffer
from sessions.config import VideoConfig
from sessions.errors import MediaError
from sessions.event_log import EventLog
from sessions.events import ConversationItem, OutputAudioDelta, SpeechStarted
from sessions.frame_cache import FrameCache, sample_indices
from sessions.frame_window import FrameWindow
from sessions.history import History
from sessions.keys import SessionKeys


def frame(value: int) -> bytes:
    return np.full(320, value, dtype=np.int16).tobytes()


def jpeg(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "JPEG")
    return out.getvalue()


def noise_jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture
async def keys(redis: aioredis.Redis) -> object:
    k = SessionKeys("sess_test")
    yield k
    await redis.delete(*k.all())


async def test_audio_stream_is_capped_and_expires(redis: aioredis.Redis, keys: SessionKeys) -> None:
    buf = AudioBuffer(redis, keys, max_seconds=2, ttl_s=77)
    for second in range(6):
        await buf.append([frame(second)] * 50, first_offset_ms=second * 1000)
    length = await buf.length()
    assert 100 <= length <= 100 + 100  # MAXLEN ~ trims whole radix-tree nodes
    assert buf.dropped_frames == 200
    assert 0 < await redis.ttl(keys.audio) <= 77
    # The newest audio is all there and reads back by time.
    pcm = await buf.read(5000, 6000)
    assert len(pcm) == 50 * 320
    assert np.all(pcm == 5)
    # Half-open range: [5000, 5040) is two frames.
    assert len(await buf.read(5000, 5040)) == 640


async def test_audio_read_from_redis_cuts_entries_at_the_range(
    redis: aioredis.Redis, keys: SessionKeys
) -> None:
    """Frames are stored a batch to an entry; a read by time starting or ending inside an
    entry gets exactly the frames whose start lies in the range."""
    buf = AudioBuffer(redis, keys, max_seconds=60, recent_seconds=0, batch_frames=10)
    await buf.append([frame(i) for i in range(50)], first_offset_ms=0)  # one append, 1 s
    for i in range(50, 73):
        await buf.append([frame(i)], first_offset_ms=i * 20)
    await buf.flush()
    assert await redis.xlen(keys.audio) == 4  # 50 frames, then batches of 10, 10 and 3
    assert await buf.length() == 73
    pcm = await buf.read(210, 1250)  # frames starting at 220 ... 1240
    assert list(pcm[::320]) == list(range(11, 63))


async def test_audio_written_behind_is_all_there_once_flushed(
    redis: aioredis.Redis, keys: SessionKeys
) -> None:
    """A session's buffer writes full batches by a task of its own: appending never waits
    for Redis, and a flush (or a read, or the buffer's close) waits for what is on its way."""
    buf = AudioBuffer(redis, keys, max_seconds=60, recent_seconds=0, write_behind=True)
    for i in range(25):
        await buf.append([frame(i)], first_offset_ms=i * 20)
    # None of the appends waited for Redis: the writer, started at the tenth frame, runs
    # only now and takes all 25 in one entry
    await buf.aclose()
    assert await redis.xlen(keys.audio) == 1
    for i in range(25, 28):
        await buf.append([frame(i)], first_offset_ms=i * 20)
    pcm = await buf.read(0, 1000)  # a read writes the rest first
    assert list(pcm[::320]) == list(range(28))
    assert await buf.length() == 28
    await buf.aclose()  # idempotent


async def test_frame_cache_evicts_oldest_and_samples(
    redis: aioredis.Redis, keys: SessionKeys
) -> None:
    cache = FrameCache(redis, keys, VideoConfig(max_frames=5, frame_filter=False), ttl_s=50)
    for i in range(8):
        assert await cache.add(noise_jpeg(i), timestamp_ms=1000 + i)
    assert await cache.count() == 5
    assert cache.evicted == 3
    assert 0 < await redis.ttl(keys.frames) <= 50
    latest = await cache.sample(2, "latest")
    assert [f.timestamp_ms for f in latest] == [1006, 1007]
    uniform = await cache.sample(3, "uniform")
    assert [f.timestamp_ms for f in uniform] == [1003, 1005, 1007]
    assert uniform[0].image == noise_jpeg(3)
    # Asking for more frames than cached gives what there is.
    assert len(await cache.sample(128)) == 5


def test_sample_indices() -> None:
    assert sample_indices(50, 4, "uniform") == [0, 16, 33, 49]
    assert sample_indices(50, 4, "latest") == [46, 47, 48, 49]
    assert sample_indices(0, 4, "uniform") == []
    assert sample_indices(3, 1, "uniform") == [2]


async def test_similar_frame_filter_drops_near_duplicates(
    redis: aioredis.Redis, keys: SessionKeys
) -> None:
    cache = FrameCache(redis, keys, VideoConfig(frame_filter_threshold=0.95))
    assert await cache.add(jpeg((100, 100, 100)), 1)
    assert not await cache.add(jpeg((102, 101, 100)), 2)  # nearly identical
    assert await cache.add(noise_jpeg(7), 3)  # a different scene
    assert cache.filtered == 1
    assert await cache.count() == 2


async def test_frame_cache_rejects_bad_images_and_keeps_frames(
    redis: aioredis.Redis, keys: SessionKeys
) -> None:
    cache = FrameCache(redis, keys, VideoConfig(frame_filter=False))
    await cache.add(jpeg((1, 2, 3)), 1)
    with pytest.raises(MediaError, match="invalid image data"):
        await cache.add(b"not an image at all", 2)
    with pytest.raises(MediaError, match="empty"):
        await cache.add(b"", 3)
    with pytest.raises(MediaError, match="too large"):
        await cache.add(b"\xff" * (10 * 1024 * 1024 + 1), 4)
    assert await cache.count() == 1


async def test_frame_cache_shrinks_on_reconfigure(redis: aioredis.Redis, keys: SessionKeys) -> None:
    cache = FrameCache(redis, keys, VideoConfig(frame_filter=False))
    for i in range(6):
        await cache.add(noise_jpeg(i), i)
    await cache.reconfigure(VideoConfig(max_frames=2, frame_filter=False))
    assert await cache.count() == 2
    assert [f.timestamp_ms for f in await cache.sample(10)] == [4, 5]


async def test_frame_cache_samples_a_turns_window(redis: aioredis.Redis, keys: SessionKeys) -> None:
    config = VideoConfig(max_frames=6, num_frames=4, frame_filter=False)
    cache = FrameCache(redis, keys, config, ttl_s=50)
    for i in range(8):  # one a second; the first two are evicted
        await cache.add(noise_jpeg(i), 1000 * i)
    assert await redis.llen(keys.frame_times) == 6  # trimmed with the frames
    assert 0 < await redis.ttl(keys.frame_times) <= 50
    inside = await cache.sample(window=FrameWindow(3_500, 5_000))
    assert [f.timestamp_ms for f in inside] == [4_000, 5_000]
    assert inside[0].image == noise_jpeg(4)
    # None inside: the one on screen when the window opened; none before: the newest.
    after = await cache.sample(window=FrameWindow(20_000, 21_000))
    assert [f.timestamp_ms for f in after] == [7_000]
    before = await cache.sample(window=FrameWindow(0, 500))
    assert [f.timestamp_ms for f in before] == [4_000, 5_000, 6_000, 7_000]
    await cache.clear()
    assert not await redis.exists(keys.frames, keys.frame_times)


async def test_history_appends_updates_and_deletes(
    redis: aioredis.Redis, keys: SessionKeys
) -> None:
    history = History(redis, keys, ttl_s=30)
    first = ConversationItem(role="user", text="hello")
    second = ConversationItem(role="assistant", text="hi there, how are you", audio_ms=900)
    assert await history.append(first) is None
    assert await history.append(second) == first.id
    second.text, second.audio_ms, second.status = "hi there", 400, "incomplete"
    assert await history.update(second)
    items = await history.items()
    assert [(i.role, i.text, i.audio_ms) for i in items] == [
        ("user", "hello", 0),
        ("assistant", "hi there", 400),
    ]
    assert 0 < await redis.ttl(keys.items) <= 30
    assert await history.delete(first.id)
    assert [i.id for i in await history.items()] == [second.id]


async def test_history_is_bounded(redis: aioredis.Redis, keys: SessionKeys) -> None:
    history = History(redis, keys, max_items=3)
    items = [ConversationItem(role="user", text=str(i)) for i in range(5)]
    for item in items:
        await history.append(item)
    assert [i.text for i in await history.items()] == ["2", "3", "4"]
    assert history.dropped == 2
    assert await redis.hlen(keys.items) == 3


async def test_event_log_replays_in_order(redis: aioredis.Redis, keys: SessionKeys) -> None:
    import asyncio

    log = EventLog(redis, keys, ttl_s=40)
    writer = asyncio.create_task(log.run())
    try:
        events = [SpeechStarted(audio_start_ms=i, item_id=f"item_{i}") for i in range(5)]
        for event in events:
            log.record(event)
        log.record(OutputAudioDelta(response_id="r", item_id="i", pcm=b"\0\0", sample_rate=24000))
        await log.flushed()
    finally:
        await cancel_and_wait(writer)
    replayed = await log.replay()
    assert [e["audio_start_ms"] for e in replayed] == [0, 1, 2, 3, 4]
    assert all(e["type"] == "input_audio_buffer.speech_started" for e in replayed)
    after = await log.replay(after_event_id=events[2].event_id)
    assert [e["event_id"] for e in after] == [events[3].event_id, events[4].event_id]
    with pytest.raises(KeyError):
        await log.replay(after_event_id="evt_unknown")
    assert 0 < await redis.ttl(keys.events) <= 40


async def test_two_sessions_never_share_keys(redis: aioredis.Redis) -> None:
    a, b = SessionKeys("sess_a"), SessionKeys("sess_b")
    try:
        assert not set(a.all()) & set(b.all())
        await AudioBuffer(redis, a, 10).append([frame(1)], 0)
        await AudioBuffer(redis, b, 10).append([frame(2)], 0)
        assert np.all(await AudioBuffer(redis, a, 10).read(0, 20) == 1)
        assert np.all(await AudioBuffer(redis, b, 10).read(0, 20) == 2)
        for key in await redis.keys("*"):
            assert ("{sess_a}" in key.decode()) != ("{sess_b}" in key.decode())
    finally:
        await redis.delete(*a.all(), *b.all())
