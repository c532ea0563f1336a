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
import pytest_asyncio
import soxr
from piper import SynthesisConfig

from loadtest.speech import Pcm, silence, trim_silence
from pipeline.engines.cascade.voice import clause_phoneme_ids, load_voice
from tests.conftest import fail_on_keys_left, fail_on_tasks_left
from tests.realtime.apps import ServedApp, served_app
from web.settings import Settings

KEY = "sk-test-parley-frameworks"
FRAMEWORKS_DB = 1
"""The frameworks' servers' database on the test redis-server (the tests' own is 0)."""
LOOP = pytest.mark.asyncio(loop_scope="module")
"""Each module's tests run in its loop, the loop its server runs in."""
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """The suite's leak check, in the module's loop where these tests run (the suite's own
    would look at a loop of its own and see nothing)."""
    before = asyncio.all_tasks()
    yield
    await fail_on_tasks_left(before)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def parley_server(redis_socket: str) -> AsyncIterator[ServedApp]:
    """The default pipeline served with an API key, two sessions at most: one server per
    module, as its start (the cascade's models, its worker) is most of a test's time. It
    keeps its state in a database of its own on the test redis-server, which must be empty
    once the server has stopped."""
    url = f"unix://{redis_socket}?db={FRAMEWORKS_DB}"
    settings = Settings(pipeline="cascade", api_key=KEY, max_sessions=2)
    async with served_app(settings, url) as served:
        yield served
    fail_on_keys_left(redis_socket, FRAMEWORKS_DB, "the frameworks' server")


@pytest_asyncio.fixture(loop_scope="module")
async def parley(parley_server: ServedApp) -> AsyncIterator[ServedApp]:
    """The module's server, with no session of an earlier test on it; a test whose
    sessions outlive it by more than a few seconds fails."""
    await sessions_ended(parley_server)
    yield parley_server
    await sessions_ended(parley_server)


async def sessions_ended(server: ServedApp, within_s: float = 10.0) -> None:
    manager = server.manager
    try:
        async with asyncio.timeout(within_s):
            while len(manager):
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"{len(manager)} session(s) still open {within_s:g} s after the test")


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
