"""A microphone for the voice benchmark: Piper speech at 24 kHz, sent at the pace it is captured.

A real microphone never stops and never sends faster than time passes: chunk k of 20 ms
leaves when its last sample has been captured, at t0 + (k + 1) * 20 ms, and between
utterances it sends background noise (never digital zero). Because the client chooses every
sample, it knows on its own clock the instant of the last voiced sample of each question:
the benchmark's zero for every latency.

Speech is Piper's joe voice (the cascade's own voice package), resampled to 24 kHz and
trimmed of the synthesiser's silence (`speech.trim_silence`) so its edges are exact.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import soxr
from websockets.asyncio.client import ClientConnection

from .speech import trim_silence

Pcm = npt.NDArray[np.int16]

RATE = 24_000
"""The WebSocket's default input format: PCM16 at 24 kHz."""
CHUNK = RATE // 50
"""20 ms of samples per `input_audio_buffer.append`."""
LEAD_MS = 300
"""Background noise before each question's first word."""
NOISE = 30
"""Peak amplitude of the background noise (PCM16), about -61 dBFS."""


@lru_cache(maxsize=64)
def spoken(text: str) -> Pcm:
    """`text` spoken by Piper's joe voice at 24 kHz, trimmed to its voiced part."""
    from pipeline.engines.cascade.voice import load_voice

    voice = load_voice()
    pcm = np.concatenate([c.audio_int16_array for c in voice.synthesize(text)])
    resampled = soxr.resample(pcm, voice.config.sample_rate, RATE).astype(np.int16)
    trimmed: Pcm = trim_silence(resampled)
    trimmed.setflags(write=False)
    return trimmed


class Microphone:
    """Streams what it is told to say, and noise otherwise, in 20 ms chunks at real time."""

    def __init__(self, ws: ClientConnection, seed: int = 7) -> None:
        self._ws = ws
        self._rng = np.random.default_rng(seed)
        self._queued: Pcm = np.zeros(0, dtype=np.int16)
        self._sent = 0
        """Samples sent so far."""
        self._t0: float | None = None
        self.max_lag_s = 0.0
        """The latest any chunk left after its capture time (the pacing's own error)."""

    @property
    def t0(self) -> float:
        if self._t0 is None:
            self._t0 = time.monotonic()
        return self._t0

    @property
    def idle_at(self) -> float:
        """When everything said so far will have been sent."""
        return self.t0 + (self._sent + len(self._queued)) / RATE

    def say(self, speech: Pcm, tail_ms: int) -> float:
        """Queue `LEAD_MS` of noise, `speech`, `tail_ms` of noise: the last voiced sample's
        capture time on the monotonic clock."""
        lead = LEAD_MS * RATE // 1000
        start = self._sent + len(self._queued)
        self._queued = np.concatenate(
            [
                self._queued,
                np.zeros(lead, np.int16),
                speech,
                np.zeros(tail_ms * RATE // 1000, np.int16),
            ]
        )
        return self.t0 + (start + lead + len(speech)) / RATE

    async def run(self) -> None:
        """Send chunks until cancelled."""
        t0 = self.t0
        while True:
            due = t0 + (self._sent + CHUNK) / RATE
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.max_lag_s = max(self.max_lag_s, time.monotonic() - due)
            chunk, self._queued = self._queued[:CHUNK], self._queued[CHUNK:]
            if len(chunk) < CHUNK:
                chunk = np.concatenate([chunk, np.zeros(CHUNK - len(chunk), np.int16)])
            noise = self._rng.integers(-NOISE, NOISE + 1, size=CHUNK)
            pcm = np.clip(chunk.astype(np.int32) + noise, -32768, 32767).astype("<i2")
            audio = base64.b64encode(pcm.tobytes()).decode("ascii")
            await self._ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            self._sent += CHUNK
