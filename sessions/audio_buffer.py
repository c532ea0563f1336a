"""The session's input audio in Redis: a capped stream of 20 ms frames.

Entry ids are `<offset_ms>-1`, the frame's start on the session's input timeline, so a
turn's audio is one XRANGE by time. The stream is capped with `XADD MAXLEN ~` at
`max_seconds` of audio; what falls off the front is counted as dropped.

Frames are written in batches of `batch_frames` (100 ms by default): a call sends 50 frames
a second, and one Redis round trip per frame per call costs more event-loop time than the
rest of the inbound path. Reading a range writes what is pending first, so a turn's audio is
always complete.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis

from .keys import DEFAULT_KEY_TTL_S, SessionKeys
from .resample import FRAME_MS

FRAMES_PER_SECOND = 1000 // FRAME_MS


class AudioBuffer:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: SessionKeys,
        max_seconds: int,
        ttl_s: int = DEFAULT_KEY_TTL_S,
        batch_frames: int = 5,
    ) -> None:
        self._redis = redis
        self._key = keys.audio
        self._ttl_s = ttl_s
        self.max_seconds = max_seconds
        self._held = 0
        self.dropped_frames = 0
        self.batch_frames = batch_frames
        self._pending: list[tuple[int, bytes]] = []

    @property
    def max_frames(self) -> int:
        return self.max_seconds * FRAMES_PER_SECOND

    async def append(self, frames: list[bytes], first_offset_ms: int) -> None:
        """Add consecutive 20 ms frames, the first starting at `first_offset_ms`."""
        self._pending += [(first_offset_ms + i * FRAME_MS, f) for i, f in enumerate(frames)]
        if len(self._pending) >= self.batch_frames:
            await self.flush()

    async def flush(self) -> None:
        """Write the pending frames now."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        cap = self.max_frames
        pipe = self._redis.pipeline(transaction=False)
        for offset, frame in pending:
            pipe.xadd(self._key, {"pcm": frame}, id=f"{offset}-1", maxlen=cap, approximate=True)
        pipe.expire(self._key, self._ttl_s)
        await pipe.execute()
        self._held += len(pending)
        if self._held > cap:
            self.dropped_frames += self._held - cap
            self._held = cap

    async def read(self, start_ms: int, end_ms: int) -> npt.NDArray[np.int16]:
        """The frames whose start lies in [start_ms, end_ms), as one PCM16 array."""
        if end_ms <= start_ms:
            return np.zeros(0, dtype=np.int16)
        await self.flush()
        entries = await self._redis.xrange(
            self._key, min=str(max(start_ms, 0)), max=str(end_ms - 1)
        )
        if not entries:
            return np.zeros(0, dtype=np.int16)
        pcm = b"".join(fields[b"pcm"] for _, fields in entries)
        return np.frombuffer(pcm, dtype=np.int16).copy()

    async def clear(self) -> None:
        self._pending = []
        await self._redis.delete(self._key)
        self._held = 0

    async def length(self) -> int:
        await self.flush()
        return int(await self._redis.xlen(self._key))
