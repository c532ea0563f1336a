"""The session's camera frames in Redis: a bounded list, oldest evicted.

Frames arrive as encoded images (JPEG or PNG) with a timestamp and are stored as they
came. An optional similar-frame filter drops a frame whose tiny grey thumbnail is nearly
identical to the last kept one, so a still camera does not flush the cache. Sampling for a
turn fetches only the frames it picks: a second list holds just the frames' timestamps
(8 bytes each, trimmed with the frames), so picking by time (frame_window.py) reads the
timestamps, not the images. The two lists are aligned at their newest ends.

Writes go through the session's spill: while Redis is unreachable the frames are kept
locally (bounded), a turn samples from the frames kept since, and they are written back
when Redis answers. While Redis refuses writes (at its memory limit) it still answers
reads: a turn samples from the frames it holds followed by those kept locally.
"""

from __future__ import annotations

import asyncio
import io
import struct
from typing import Literal

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis
from PIL import Image, UnidentifiedImageError
from redis.asyncio.client import Pipeline

from pipeline.types import VideoFrame

from .config import VideoConfig
from .errors import MediaError, RedisUnavailableError
from .frame_window import FrameWindow, choose_frames, sample_indices
from .keys import DEFAULT_KEY_TTL_S, SessionKeys
from .redis_link import RedisLink
from .spill import Spill

MAX_FRAME_BYTES = 10 * 1024 * 1024
THUMB_SIZE = 16
_TS = struct.Struct(">q")

Thumbnail = npt.NDArray[np.float32]


def thumbnail(image: bytes) -> Thumbnail:
    """A 16x16 grey thumbnail; raises MediaError when the bytes are not an image we read."""
    try:
        with Image.open(io.BytesIO(image)) as img:
            if img.format not in ("JPEG", "PNG"):
                raise MediaError(f"unsupported image format {img.format}: send JPEG or PNG")
            img.draft("L", (THUMB_SIZE * 4, THUMB_SIZE * 4))  # JPEG: decode at reduced scale
            small = img.convert("L").resize((THUMB_SIZE, THUMB_SIZE), Image.Resampling.BILINEAR)
            return np.asarray(small, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaError(f"invalid image data: {exc}") from None


def similarity(a: Thumbnail, b: Thumbnail) -> float:
    """1.0 for identical thumbnails, 0.0 for black against white."""
    return 1.0 - float(np.mean(np.abs(a - b))) / 255.0


__all__ = ["FrameCache", "sample_indices", "similarity", "thumbnail"]

UNKNOWN_TIME_MS = -(2**62)
"""The time of a frame whose timestamp Redis does not hold (written before the list of
timestamps existed): older than any window."""


def _time_of(packed: bytes) -> int:
    return int(_TS.unpack_from(packed)[0])


class FrameCache:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: SessionKeys,
        config: VideoConfig,
        ttl_s: int = DEFAULT_KEY_TTL_S,
        spill: Spill | None = None,
    ) -> None:
        self._spill = spill if spill is not None else Spill(RedisLink(redis))
        self._link = self._spill.link
        self._key = keys.frames
        self._times_key = keys.frame_times
        self._ttl_s = ttl_s
        self.config = config
        self._last_kept: Thumbnail | None = None
        self.evicted = 0
        self.filtered = 0

    async def add(self, image: bytes, timestamp_ms: int) -> bool:
        """Store a frame; False when the similar-frame filter dropped it."""
        if not image:
            raise MediaError("empty video frame")
        if len(image) > MAX_FRAME_BYTES:
            raise MediaError(
                f"frame too large: {len(image)} bytes (the limit is {MAX_FRAME_BYTES} bytes)"
            )
        thumb = await asyncio.to_thread(thumbnail, image)
        if (
            self.config.frame_filter
            and self._last_kept is not None
            and similarity(thumb, self._last_kept) >= self.config.frame_filter_threshold
        ):
            self.filtered += 1
            return False
        key, times, cap, ttl = self._key, self._times_key, self.config.max_frames, self._ttl_s
        stamp = _TS.pack(timestamp_ms)
        packed = stamp + image

        def apply(pipe: Pipeline) -> None:
            pipe.rpush(key, packed)
            pipe.ltrim(key, -cap, -1)
            pipe.expire(key, ttl)
            pipe.rpush(times, stamp)
            pipe.ltrim(times, -cap, -1)
            pipe.expire(times, ttl)

        results = await self._spill.write("frames", apply, size=len(packed), values=[packed])
        if results is not None:
            self.evicted += max(0, int(results[0]) - cap)
        elif len(self._spill.pending("frames")) > cap:
            self.evicted += 1  # kept locally: the write back trims the oldest
        self._last_kept = thumb
        return True

    async def reconfigure(self, config: VideoConfig) -> None:
        """Apply new settings; a smaller cap evicts the oldest frames now."""
        if config.max_frames < self.config.max_frames:
            before = await self.count()
            keys, cap = (self._key, self._times_key), config.max_frames

            def trim(pipe: Pipeline) -> None:
                for key in keys:
                    pipe.ltrim(key, -cap, -1)

            await self._spill.write("frames", trim)
            self.evicted += max(0, before - config.max_frames)
        self.config = config

    async def count(self) -> int:
        """Frames held; during a Redis outage, those kept locally since it began."""
        try:
            stored, kept = await self._stored()
        except RedisUnavailableError:
            return len(self._local())
        return min(stored + len(kept), self.config.max_frames)

    async def _stored(self) -> tuple[int, list[bytes]]:
        """How many frames Redis holds, and the frames kept locally to follow them (while
        Redis refuses writes). RedisUnavailableError when Redis cannot say (an outage, or
        a clear or trim kept locally that Redis has not seen)."""
        await self._spill.settle()
        kept: list[bytes] = []
        if self._spill.holds("frames"):
            if not self._link.up or not self._spill.adds_only("frames"):
                raise self._link.unavailable()
            kept = self._spill.pending("frames")
        stored = int(await self._link.call(lambda: self._link.redis.llen(self._key)))
        return stored, kept

    def _local(self) -> list[bytes]:
        return self._spill.pending("frames")[-self.config.max_frames :]

    async def sample(
        self,
        n: int | None = None,
        strategy: Literal["uniform", "latest"] | None = None,
        window: FrameWindow | None = None,
    ) -> list[VideoFrame]:
        """Pick frames for a turn (oldest first), fetching only the picked ones: from
        `window` as frame_window.py says, or from the whole cache (None). During a Redis
        outage the picks come from the frames kept locally since it began."""
        n = self.config.num_frames if n is None else n
        strategy = strategy or self.config.sampling_strategy
        try:
            raws = await self._sample_redis(n, strategy, window)
        except RedisUnavailableError:
            local = self._local()
            times = [_time_of(raw) for raw in local] if window is not None else [0] * len(local)
            raws = [local[i] for i in choose_frames(times, window, n, strategy)]
        frames = []
        for raw in raws:
            if raw is not None:  # evicted between LLEN and LINDEX
                (ts,) = _TS.unpack_from(raw)
                frames.append(VideoFrame(image=bytes(raw[_TS.size :]), timestamp_ms=ts))
        return frames

    async def _sample_redis(
        self, n: int, strategy: Literal["uniform", "latest"], window: FrameWindow | None
    ) -> list[bytes | None]:
        stored, kept = await self._stored()
        held = min(stored + len(kept), self.config.max_frames)
        skip = stored + len(kept) - held  # the oldest, which the write back trims
        if window is None:
            chosen = sample_indices(held, n, strategy)
        else:
            times = await self._times(stored) + [_time_of(raw) for raw in kept]
            chosen = choose_frames(times[skip:], window, n, strategy)
        picks = [skip + i for i in chosen]
        in_redis = [index for index in picks if index < stored]
        key = self._key

        async def fetch() -> list[bytes | None]:
            pipe = self._link.redis.pipeline(transaction=False)
            for index in in_redis:
                pipe.lindex(key, index)
            return list(await pipe.execute())

        fetched = dict(zip(in_redis, await self._link.call(fetch), strict=True)) if in_redis else {}
        return [fetched[i] if i < stored else kept[i - stored] for i in picks]

    async def _times(self, stored: int) -> list[int]:
        """The timestamps of the `stored` frames in Redis, oldest first."""
        if stored <= 0:
            return []
        times_key = self._times_key
        raw: list[bytes] = await self._link.call(
            lambda: self._link.redis.lrange(times_key, -stored, -1)
        )
        known = [int(_TS.unpack(stamp)[0]) for stamp in raw[-stored:]]
        return [UNKNOWN_TIME_MS] * (stored - len(known)) + known

    async def clear(self) -> None:
        self._spill.discard("frames")
        keys = (self._key, self._times_key)
        await self._spill.write("frames", lambda pipe: pipe.delete(*keys))
        self._last_kept = None
