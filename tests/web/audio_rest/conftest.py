"""One real `parley serve` (the default cascade, with an API key) for every test of the
audio REST endpoints here (its start is most of their time), and the spoken audio they upload."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator

import av
import numpy as np
import numpy.typing as npt
import openai
import pytest

from loadtest.served import Served, parley_serve
from loadtest.speech import silence, speak

KEY = "sk-test-parley-audio-rest"
SPOKEN = "Please tell me about the weather today."
SPOKEN_WORDS = ("weather", "today")
"""Words Whisper base hears in espeak-ng's reading of SPOKEN."""
SAID = "Hello there. The capital of France is Paris."
SAID_WORDS = ("hello", "capital", "france", "paris")
"""Words of SAID: Whisper base hears most of them back in Piper's reading, in every format.
Not always all: Piper's voice varies from reading to reading (its noise scales), and through
Opus Whisper once heard "the capital of Francis Peris" (a fresh-clone run, 2026-12-06)."""
SAID_HEARD = 2
"""Of SAID_WORDS, at least this many heard back: noise or a broken format gives none."""


@pytest.fixture(scope="package")
def server() -> Iterator[Served]:
    """`parley serve --pipeline cascade --api-key KEY` in a child process, as deployed."""
    with parley_serve("--pipeline", "cascade", "--api-key", KEY, "--max-sessions", "2") as served:
        yield served


@pytest.fixture
def client(server: Served) -> Iterator[openai.OpenAI]:
    """The official SDK pointed at the server (its base URL and key, nothing else)."""
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=0) as sdk:
        yield sdk


def wav(pcm: npt.NDArray[np.int16], rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm.astype("<i2").tobytes())
    return buffer.getvalue()


def spoken_wav(text: str = SPOKEN, rate: int = 16_000) -> bytes:
    """`text` read by espeak-ng, with a little silence around it, as a WAV file."""
    pcm = np.concatenate([silence(300, rate), speak(text, rate), silence(500, rate)])
    return wav(pcm, rate)


def decoded(data: bytes) -> tuple[int, npt.NDArray[np.float32]]:
    """A file of any format (PyAV) -> its rate and its mono samples."""
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = list(container.decode(audio=0))
    samples = np.concatenate([f.to_ndarray().reshape(f.layout.nb_channels, -1)[0] for f in frames])
    return frames[0].sample_rate, samples.astype(np.float32)


def heard(text: str, words: tuple[str, ...], at_least: int | None = None) -> bool:
    """Whether `text` has `words` (all of them, or at least `at_least`)."""
    lowered = text.lower()
    found = sum(word in lowered for word in words)
    return found >= (len(words) if at_least is None else at_least)
