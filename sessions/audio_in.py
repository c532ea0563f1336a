"""A session's input audio path, from the client's PCM to turn-taking.

Audio comes in at any supported rate and channel count (PCM16 interleaved). It is
resampled to 16 kHz mono 20 ms frames (a change of format mid-stream flushes the old
resampler first, and a format that cannot be read is refused before any state changes),
cleaned by the session's noise suppressor when `noise_reduction` is on (noise_reduction.py:
everything after hears the cleaned audio), heard by a duplex model as it comes, placed on
the session's input timeline (`Turns`), buffered (Redis, audio_buffer.py) and heard by
turn-taking (turn_taking.py), all under the session's media lock, so a commit or a clear
never lands between a frame's buffering and its detection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pipeline.audio_format import FRAME_MS

from .config import NoiseReductionConfig
from .duplex_turns import DuplexTurns
from .noise_reduction import InputNoiseReduction
from .resample import InputResampler
from .store import SessionStore
from .turn_taking import TurnTaking
from .turns import Turns

log = logging.getLogger("parley.sessions.audio_in")


class AudioIn:
    def __init__(
        self,
        store: SessionStore,
        turns: Turns,
        turn_taking: TurnTaking,
        media_lock: asyncio.Lock,
        duplex: DuplexTurns | None,
        noise_reduction: NoiseReductionConfig | None = None,
    ) -> None:
        """`store`: the session's (its audio buffer, its metrics); `noise_reduction`: the
        session's setting (None: off)."""
        self._session_id = store.session_id
        self._audio = store.audio
        self._turns = turns
        self._turn_taking = turn_taking
        self._metrics = store.metrics
        self._lock = media_lock
        self._duplex = duplex
        self._resampler: InputResampler | None = None
        self._noise = InputNoiseReduction(noise_reduction)

    def reconfigure(self, noise_reduction: NoiseReductionConfig | None) -> None:
        """A `session.update`'s setting, from the next frame on."""
        self._noise.reconfigure(noise_reduction)

    def close(self) -> None:
        """Idempotent: the suppressor's state goes; later audio passes as it is."""
        self._noise.close()

    def _frames(self, pcm: bytes, sample_rate: int, channels: int) -> list[bytes]:
        """`pcm` as 20 ms frames at 16 kHz mono (MediaError if its format is unsupported)."""
        resampler, tail = self._resampler, []
        if resampler is None or (resampler.sample_rate, resampler.channels) != (
            sample_rate,
            channels,
        ):
            fresh = InputResampler(sample_rate, channels)  # raises MediaError if unsupported
            fresh.push(pcm)  # validate on a throwaway before touching the live stream
            tail = resampler.flush() if resampler is not None else []
            resampler = self._resampler = InputResampler(sample_rate, channels)
        return tail + resampler.push(pcm)  # validates before changing any state

    async def append(
        self, pcm: bytes, sample_rate: int, channels: int, check_open: Callable[[], None]
    ) -> None:
        """`check_open()` raises once the session is closing (checked under the lock)."""
        frames = self._noise.process(self._frames(pcm, sample_rate, channels))
        if self._duplex is not None:
            self._duplex.hear(frames)
        audio, metrics = self._audio, self._metrics
        async with self._lock:
            check_open()
            first = self._turns.received(FRAME_MS * len(frames))
            try:
                await audio.append(frames, first)
            except Exception as exc:
                metrics.redis_errors.inc()
                log.warning("session %s: audio buffer write failed: %s", self._session_id, exc)
            before = audio.dropped_frames
            await self._turn_taking.hear(frames, first)
            if audio.dropped_frames > before:
                metrics.dropped_frames.labels("audio").inc(audio.dropped_frames - before)
