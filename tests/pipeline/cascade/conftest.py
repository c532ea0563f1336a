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
from piper import PiperVoice

from loadtest.speech_set import piper_speaker
from pipeline.engines.cascade.smollm import LanguageModel, load_language_model
from pipeline.engines.cascade.voice import load_voice

Speak = Callable[[str], npt.NDArray[np.int16]]


@pytest.fixture(scope="session")
def language_model() -> LanguageModel:
    started = time.perf_counter()
    lm = load_language_model()
    print(f"\nSmolLM2 loaded in {time.perf_counter() - started:.2f} s")
    return lm


@pytest.fixture(scope="session")
def int8_language_model() -> LanguageModel:
    """SmolLM2 with int8 matrices (the Thinker's `weights: int8`), kept beside the float one."""
    started = time.perf_counter()
    lm = load_language_model(weights="int8")
    print(f"\nSmolLM2 (int8) loaded in {time.perf_counter() - started:.2f} s")
    return lm


@pytest.fixture(scope="session")
def voice() -> PiperVoice:
    return load_voice()


@pytest.fixture(scope="session")
def speak() -> Speak:
    """Text -> PCM16 at INPUT_SAMPLE_RATE, spoken by the Piper joe voice with its noise off.

    Piper's prosody noise cannot be seeded; with it on, the same sentence came out differently
    from run to run and a recognition test failed on one CI machine in several."""
    return piper_speaker()
