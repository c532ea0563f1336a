"""Real models, loaded once per test session by sync fixtures (no event loop involved).

The loaders keep what they load per process, so an engine started inside a test finds its
model already in memory and starts in milliseconds. The first run on a machine converts
SmolLM2's GGUF weights into the on-disk cache (~20 s); later runs load them in under a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
import soxr
from piper import PiperVoice

from pipeline.engines.cascade.smollm import LanguageModel, load_language_model
from pipeline.engines.cascade.voice import clause_phoneme_ids, load_voice
from pipeline.types import INPUT_SAMPLE_RATE

Speak = Callable[[str], npt.NDArray[np.int16]]


@pytest.fixture(scope="session")
def language_model() -> LanguageModel:
    started = time.perf_counter()
    lm = load_language_model()
    print(f"\nSmolLM2 loaded in {time.perf_counter() - started:.2f} s")
    return lm


@pytest.fixture(scope="session")
def voice() -> PiperVoice:
    return load_voice()


@pytest.fixture(scope="session")
def speak(voice: PiperVoice) -> Speak:
    """Text -> PCM16 at INPUT_SAMPLE_RATE, spoken by the Piper joe voice."""

    def say(text: str) -> npt.NDArray[np.int16]:
        ids = [int(i) for i in clause_phoneme_ids(voice, text)]
        audio = np.asarray(voice.phoneme_ids_to_audio(ids), dtype=np.float32).reshape(-1)
        audio = audio / max(0.01, float(np.abs(audio).max()))
        resampled = np.asarray(
            soxr.resample(audio, voice.config.sample_rate, INPUT_SAMPLE_RATE), dtype=np.float32
        )
        return (np.clip(resampled, -1, 1) * 32767).astype(np.int16)

    return say
