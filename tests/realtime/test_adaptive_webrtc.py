"""`interruption: "adaptive"` on an OpenAI Realtime WebRTC call (aiortc on both sides): a
backchannel over the answer on the microphone track leaves every frame of it on the
remote track; the setting comes through the data channel like any session field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller

from .apps import fake_app

ANSWER_MS = 4_000


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    engine = f"audio_ms: {ANSWER_MS}, realtime_factor: 4.0, transcript: 'Yeah.'"
    async with fake_app(tmp_path, redis_url, engine, max_sessions=2) as running:
        yield running


@pytest.fixture
async def caller(http: httpx.AsyncClient) -> AsyncIterator[Caller]:
    c = Caller(http)
    yield c
    await c.close()


async def all_heard(caller: Caller, quiet_s: float = 1.0) -> int:
    """The loud frames on the remote track once no new one has come for `quiet_s` (the
    receiver runs behind the server's playout on a busy machine)."""
    async with asyncio.timeout(15):
        while True:
            before = len(caller.loud_since(0))
            await asyncio.sleep(quiet_s)
            if len(caller.loud_since(0)) == before:
                return before


@pytest.mark.slow
async def test_a_backchannel_on_the_microphone_leaves_the_answer_whole(caller: Caller) -> None:
    assert (await caller.connect()).status_code == 201
    await caller.wait_for(lambda e: e["type"] == "session.created")
    detection = {"type": "server_vad", "interruption": "adaptive"}
    session = {"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
    caller.send({"type": "session.update", "session": session})
    updated = await caller.wait_for(lambda e: e["type"] == "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"]["interruption"] == "adaptive"
    question = trim_silence(speak("What is the weather like today?"))
    caller.mic.say(np.concatenate([silence(300), question]))
    await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.started", within_s=30)
    await asyncio.sleep(1.0)
    caller.mic.say(trim_silence(speak("Yeah.")))
    done = await caller.wait_for(lambda e: e["type"] == "response.done", within_s=15)
    assert done["response"]["status"] == "completed"
    await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", within_s=15)
    assert caller.count("input_audio_buffer.speech_started") == 2  # heard over the answer
    assert "conversation.item.truncated" not in caller.types()
    assert "output_audio_buffer.cleared" not in caller.types()
    assert caller.count("response.created") == 1
    loud_frames = await all_heard(caller)  # 20 ms each: the whole answer, held and resumed
    assert abs(loud_frames - ANSWER_MS // 20) <= 5, loud_frames
