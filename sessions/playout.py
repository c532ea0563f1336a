"""A bounded, clearable playout buffer with a playback cursor.

While paused (the user started talking over the answer, not yet long enough to count as
an interruption) it plays silence and keeps its queue, so a cough costs a pause, not the
answer.

Transports drive it from their media clock: a WebRTC track pulls one 20 ms frame per
packet time with `next_frame()`, getting silence when nothing is queued. Audio is cut into
20 ms frames on the way in, so `clear()` takes effect at the next frame. Writers wait while
the buffer is full, which paces generation to playback without an unbounded queue.
"""

from __future__ import annotations

import asyncio
import collections

import numpy as np
import numpy.typing as npt
import soxr

FRAME_MS = 20


class PlayoutBuffer:
    def __init__(self, sample_rate: int = 24_000, max_ms: int = 2_000) -> None:
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * FRAME_MS // 1000
        self.max_frames = max(1, max_ms // FRAME_MS)
        self._frames: collections.deque[npt.NDArray[np.int16]] = collections.deque()
        self._partial = np.zeros(0, dtype=np.int16)
        self._room = asyncio.Event()
        self._room.set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.paused = False
        self._played_frames = 0
        self._played_partial_samples = 0
        self.silence = np.zeros(self.frame_samples, dtype=np.int16)

    @property
    def played_ms(self) -> int:
        samples = self._played_frames * self.frame_samples + self._played_partial_samples
        return samples * 1000 // self.sample_rate

    @property
    def queued_ms(self) -> int:
        return (
            (len(self._frames) * self.frame_samples + len(self._partial))
            * 1000
            // (self.sample_rate)
        )

    async def write(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        if sample_rate != self.sample_rate:
            pcm = soxr.resample(pcm, sample_rate, self.sample_rate)
        data = np.concatenate([self._partial, pcm.astype(np.int16, copy=False)])
        n = self.frame_samples
        whole = len(data) // n
        for i in range(whole):
            while len(self._frames) >= self.max_frames:
                self._room.clear()
                await self._room.wait()
            self._frames.append(data[i * n : (i + 1) * n])
            self._empty.clear()
        self._partial = data[whole * n :]
        if len(self._partial):
            self._empty.clear()

    def flush_partial(self) -> None:
        """Pad the last partial frame with silence so it plays (end of an utterance)."""
        if len(self._partial):
            frame = np.zeros(self.frame_samples, dtype=np.int16)
            frame[: len(self._partial)] = self._partial
            self._frames.append(frame)
            self._partial = np.zeros(0, dtype=np.int16)

    def pause(self) -> None:
        """Hold playback (the user may be interrupting): silence, nothing consumed."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def next_frame(self) -> npt.NDArray[np.int16]:
        """The next 20 ms to play: queued audio, or silence when idle or paused."""
        if self.paused:
            return self.silence
        if not self._frames:
            if len(self._partial):  # generation paused mid-frame: play what we have
                self.flush_partial()
            else:
                self._empty.set()
                return self.silence
        frame = self._frames.popleft()
        self._played_frames += 1
        self._room.set()
        if not self._frames and not len(self._partial):
            self._empty.set()
        return frame

    def clear(self) -> None:
        self._frames.clear()
        self._partial = np.zeros(0, dtype=np.int16)
        self._empty.set()
        self._room.set()

    async def drained(self) -> None:
        await self._empty.wait()


class PlayoutSink:
    """The audio half of an OutputSink for transports with a media clock: everything goes
    through one PlayoutBuffer, which the transport drains frame by frame. Subclasses add
    `event()` and may extend `clear`/`pause` (calling these)."""

    def __init__(self, playout: PlayoutBuffer) -> None:
        self.playout = playout

    async def audio(self, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
        await self.playout.write(pcm, sample_rate)

    def clear(self) -> None:
        self.playout.clear()

    def pause(self) -> None:
        self.playout.pause()

    def resume(self) -> None:
        self.playout.resume()

    @property
    def played_ms(self) -> int:
        return self.playout.played_ms

    async def drained(self) -> None:
        await self.playout.drained()
