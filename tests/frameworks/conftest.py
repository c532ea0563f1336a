"""Parley as the voice-agent frameworks meet it: the embedded default pipeline (the offline
cascade) under a real uvicorn on loopback, an API key the frameworks send their own way, and
a spoken question to push through each framework's audio input at real-time pace."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import lru_cache

import numpy as np
import pytest
import soxr
from piper import SynthesisConfig

from loadtest.speech import Pcm, silence, trim_silence
from pipeline.engines.cascade.voice import clause_phoneme_ids, load_voice
from tests.realtime.apps import ServedApp, served_app
from web.settings import Settings

KEY = "sk-test-parley-frameworks"
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


@pytest.fixture
async def parley(redis_url: str) -> AsyncIterator[ServedApp]:
    """The default pipeline served with an API key; two sessions at most."""
    settings = Settings(pipeline="cascade", api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served:
        yield served


@lru_cache(maxsize=8)
def spoken(text: str, rate: int) -> Pcm:
    """`text` spoken by the Piper voice at `rate` Hz (PCM16), with silence around it long
    enough to end the turn. Piper rather than espeak-ng: pocketsphinx hears its voice well
    enough for a test to find the question's words in the transcript. Piper's noise is off, so
    a sentence is the same audio on every run (`loadtest.speech_set.piper_speaker`)."""
    voice = load_voice()
    ids = [int(i) for i in clause_phoneme_ids(voice, text)]
    fixed = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    audio = np.asarray(voice.phoneme_ids_to_audio(ids, fixed), dtype=np.float32).reshape(-1)
    audio = audio / max(0.01, float(np.abs(audio).max())) * 0.8
    resampled = np.asarray(soxr.resample(audio, voice.config.sample_rate, rate), np.float32)
    speech = trim_silence((np.clip(resampled, -1, 1) * 32767).astype(np.int16))
    pcm = np.concatenate([silence(300, rate), speech, silence(1200, rate)])
    pcm.setflags(write=False)
    return pcm


async def push_in_real_time(
    send: Callable[[bytes], Awaitable[None]], pcm: Pcm, rate: int, frame_ms: int = 20
) -> None:
    """`pcm` through `send` in `frame_ms` frames of PCM16, each at its own time, as a
    microphone would deliver them."""
    step = rate * frame_ms // 1000
    started = time.monotonic()
    for index, start in enumerate(range(0, len(pcm), step)):
        await send(pcm[start : start + step].astype("<i2").tobytes())
        due = started + (index + 1) * frame_ms / 1000
        await asyncio.sleep(max(0.0, due - time.monotonic()))


class Records(logging.Handler):
    """Every record logged at WARNING or above, with its logger's name."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, logger: str = "") -> list[str]:
        """The records of `logger` and its children ("": all of them)."""
        return [
            f"{r.name}: {r.getMessage()}"
            for r in self.records
            if not logger or r.name == logger or r.name.startswith(logger + ".")
        ]


@pytest.fixture
def warnings_logged() -> Iterator[Records]:
    """Warnings and errors logged anywhere while the test runs (the frameworks report the
    server events they cannot parse through logging, not through exceptions)."""
    records = Records()
    root = logging.getLogger()
    root.addHandler(records)
    try:
        yield records
    finally:
        root.removeHandler(records)


def live_instructions(parley: ServedApp) -> list[str]:
    """The instructions each live session on the server runs with."""
    manager = parley.services.manager
    assert manager is not None
    return [session.config.instructions for session in manager.sessions()]
