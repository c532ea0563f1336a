"""A stored GPT-Live session's recording: both sides' audio on one timeline, bounded.

GPT-Live keeps a stored session's audio for `download_recording` (`GET
/v1/live/sessions/{id}/content`). Parley records while the session runs, in memory, and
writes it to Redis once when the session ends (live_store.py): two channels of PCM16 at
16 kHz (left: the user's input as the server received it, muted audio as silence; right: the
model's output as it was sent to the transport), interleaved. Each channel is placed on the
session's wall-clock timeline: a side that was quiet (a client that sends audio only while
someone talks, the pause before an answer) is padded with silence up to the moment its next
audio arrived, so the two sides line up; audio that arrives faster than real time (a client
sending a file at once) runs ahead and is laid down in order.

Bounded: at most `max_s` seconds a channel (`--live-recording-max-s`); what comes after is
counted in `dropped_ms`, not kept. A recording is 64 KB a second, so the default cap of 600
s holds at most 38.4 MB per stored session while it runs and in Redis.
"""

from __future__ import annotations

import io
import time
import wave
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import soxr

RATE = 16_000
"""The recording's sample rate (speech needs no more; it halves what 32 kHz would cost)."""
CHANNELS = 2
USER, MODEL = 0, 1
DEFAULT_MAX_S = 600.0


class _Channel:
    """One side: PCM16 samples at RATE, with a resampler per source rate."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.samples = bytearray()
        self.dropped = 0
        self._streams: dict[int, soxr.ResampleStream] = {}

    def at(self, sample: int) -> None:
        """Pad with silence up to `sample` (a quiet stretch of this side)."""
        missing = min(sample, self.limit) - len(self.samples) // 2
        if missing > 0:
            self.samples += bytes(2 * missing)

    def add(self, pcm: npt.NDArray[np.int16], rate: int) -> None:
        if rate != RATE:
            stream = self._streams.get(rate)
            if stream is None:
                stream = self._streams[rate] = soxr.ResampleStream(rate, RATE, 1, dtype="int16")
            pcm = stream.resample_chunk(pcm)
        room = self.limit - len(self.samples) // 2
        kept = pcm[: max(room, 0)]
        self.dropped += len(pcm) - len(kept)
        self.samples += kept.astype("<i2").tobytes()

    @property
    def length(self) -> int:
        return len(self.samples) // 2


class LiveRecording:
    """Both sides of a session, recorded as they pass (`hear`, `said`)."""

    def __init__(
        self, max_s: float = DEFAULT_MAX_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_s = max_s
        self._clock = clock
        self._start = clock()
        limit = int(max_s * RATE)
        self._channels = (_Channel(limit), _Channel(limit))

    def hear(self, pcm: bytes | npt.NDArray[np.int16], rate: int) -> None:
        """The user's input (PCM16 mono at `rate`)."""
        self._add(USER, pcm, rate)

    def said(self, pcm: bytes | npt.NDArray[np.int16], rate: int) -> None:
        """The model's output (PCM16 mono at `rate`), as sent."""
        self._add(MODEL, pcm, rate)

    def _add(self, side: int, pcm: bytes | npt.NDArray[np.int16], rate: int) -> None:
        samples = np.frombuffer(pcm, "<i2") if isinstance(pcm, bytes) else pcm
        if not len(samples):
            return
        channel = self._channels[side]
        channel.at(int((self._clock() - self._start) * RATE))
        channel.add(samples, rate)

    @property
    def dropped_ms(self) -> int:
        return max(c.dropped for c in self._channels) * 1000 // RATE

    @property
    def duration_s(self) -> float:
        return max(c.length for c in self._channels) / RATE

    def pcm(self) -> bytes:
        """Both channels interleaved (left the user, right the model), as long as the
        longer one, ending at the session's end (padded with silence up to it)."""
        end = max(c.length for c in self._channels)
        end = max(end, min(int((self._clock() - self._start) * RATE), self._channels[0].limit))
        stereo = np.zeros((end, CHANNELS), dtype="<i2")
        for side, channel in enumerate(self._channels):
            samples = np.frombuffer(bytes(channel.samples), "<i2")
            stereo[: len(samples), side] = samples
        return stereo.tobytes()


def wav(pcm: bytes) -> bytes:
    """A WAV file of an interleaved stereo recording (PCM16, RATE)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(CHANNELS)
        file.setsampwidth(2)
        file.setframerate(RATE)
        file.writeframes(pcm)
    return out.getvalue()
