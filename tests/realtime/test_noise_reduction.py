"""`audio.input.noise_reduction` through a real server (uvicorn, the embedded cascade, its
Whisper): a command spoken in loud white noise (5 dB SNR) is transcribed with its key words
with the suppressor on, the setting is echoed as the session holds it (conversation and
transcription sessions, at the start and mid-session), and an unknown type is refused by
name.

Noise alone is not tested for the turns it starts: the turn detector's own noise floor
keeps steady noise from starting more than one (0-1 a minute, with or without the
suppressor: loadtest/noise_reduction_bench.py); what the suppressor changes is how long
loud noise holds such a turn open, which the spoken command's test shows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from websockets.asyncio.client import connect

from loadtest.speech import silence, speak, trim_silence
from tests.conftest import fail_on_tasks_left
from tests.frameworks.conftest import sessions_ended

from .apps import ServedApp, served_cascade
from .clients import RecordingClient

KEY = "sk-test-parley-noise"
RATE = 24_000
DB = 3
"""The cascade server's database on the test redis-server (the tests' own is 0)."""
LOOP = pytest.mark.asyncio(loop_scope="module")
NOISY_SETUP: dict[str, Any] = {
    "type": "transcription",
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": RATE},
            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
            "noise_reduction": {"type": "near_field"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
        }
    },
}
SNR_DB = 5.0

pytestmark = [LOOP, pytest.mark.slow]


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    await fail_on_tasks_left(before)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cascade(redis_socket: str) -> AsyncIterator[ServedApp]:
    async with served_cascade(redis_socket, DB, KEY, "the noise reduction tests' server") as app:
        yield app


@pytest_asyncio.fixture(loop_scope="module")
async def server(cascade: ServedApp) -> AsyncIterator[ServedApp]:
    await sessions_ended(cascade)
    yield cascade
    await sessions_ended(cascade)


@contextlib.asynccontextmanager
async def raw(server: ServedApp, query: str) -> AsyncIterator[RecordingClient]:
    url = f"{server.ws_url}/v1/realtime?{query}"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with connect(url, additional_headers=headers, proxy=None) as ws:
        yield RecordingClient(ws, wait_s=30)


@lru_cache(maxsize=4)
def noisy(text: str) -> np.ndarray:
    """`text` spoken by espeak-ng at 24 kHz in seeded white noise `SNR_DB` under it, with a
    second of noise before (the suppressor's estimate settles) and after (the turn ends:
    the detector's floor has followed the noise)."""
    speech = trim_silence(speak(text, rate=RATE)).astype(np.float64)
    clean = np.concatenate([silence(1000, RATE), speech, silence(1200, RATE)]).astype(float)
    noise = np.random.default_rng(45).normal(0.0, 1.0, len(clean))
    gain = np.sqrt(np.mean(speech**2) / (np.mean(noise**2) * 10 ** (SNR_DB / 10)))
    mixed: np.ndarray = np.clip(clean + gain * noise, -32768, 32767).astype(np.int16)
    return mixed


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


async def test_a_noisy_question_is_transcribed_with_noise_reduction_on(
    server: ServedApp,
) -> None:
    async with raw(server, "intent=transcription") as client:
        await client.wait_type("session.created")
        await client.send({"type": "session.update", "session": NOISY_SETUP})
        updated = await client.wait_type("session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
        await client.append(noisy("Turn off the lights in the kitchen."))
        done = await client.wait_type("conversation.item.input_audio_transcription.completed")
    # Without the suppressor the noise's onset starts the turn and holds it open past the
    # end of the audio (no transcript at all), and Whisper alone hears the command as "do
    # not neglect the life's invocation".
    started = next(e for e in client.events if e["type"] == "input_audio_buffer.speech_started")
    assert started["audio_start_ms"] >= 500, started  # the speech's, at 1000 ms less padding
    assert {"lights", "kitchen"} <= words(done["transcript"]), done["transcript"]


async def test_a_conversation_echoes_the_setting_and_changes_it_mid_session(
    server: ServedApp,
) -> None:
    async with raw(server, "model=parley") as client:
        created = await client.wait_type("session.created")
        assert created["session"]["audio"]["input"]["noise_reduction"] is None  # off by default
        on = {"type": "realtime", "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}
        await client.send({"type": "session.update", "session": on})
        updated = await client.wait_type("session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
        beta = {"input_audio_noise_reduction": {"type": "far_field"}}
        await client.send({"type": "session.update", "session": beta})
        updated = await client.wait_type("session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
        off = {"type": "realtime", "audio": {"input": {"noise_reduction": None}}}
        await client.send({"type": "session.update", "session": off})
        updated = await client.wait_type("session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] is None


async def test_an_unknown_type_is_refused_by_name_and_the_setting_stays(
    server: ServedApp,
) -> None:
    async with raw(server, "model=parley") as client:
        await client.wait_type("session.created")
        near = {"type": "realtime", "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}
        await client.send({"type": "session.update", "session": near})
        await client.wait_type("session.updated")
        bad = {"type": "realtime", "audio": {"input": {"noise_reduction": {"type": "studio"}}}}
        await client.send({"type": "session.update", "session": bad})
        error = (await client.wait_type("error"))["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "session.audio.input.noise_reduction.type"
        assert "studio" in error["message"] and "near_field" in error["message"]
        await client.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        updated = await client.wait_type("session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
