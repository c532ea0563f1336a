"""`parley serve --pipeline moshi_tiny` over OpenAI Realtime: the official SDK's WebSocket
and a real aiortc WebRTC call, on a full-duplex model (the toy Moshi, whose random weights
speak from the first frame and never fall quiet; tests/sessions/test_duplex_session.py
shows a model that yields). The model's voice is a response; the user's speech is heard
and said so while the model talks; `response.cancel` silences it at once; a response of
the client's own is refused, with the reason."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from loadtest.speech import utterances_with_gaps
from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, served_app
from web.settings import Settings

KEY = "sk-test-parley-duplex-rt"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[ServedApp]:
    settings = Settings(pipeline="moshi_tiny", api_key=KEY, max_sessions=4)
    async with served_app(settings, redis_url) as served:
        yield served


def question(rate: int) -> np.ndarray:
    pcm, _ = utterances_with_gaps(["What is the weather like today?"], gap_ms=600, lead_ms=300)
    if rate == 16_000:
        return pcm
    return np.repeat(pcm, rate // 16_000) if rate % 16_000 == 0 else pcm


async def engine_idle(server: ServedApp) -> None:
    engine = server.app.state.services.pipeline.engines["moshi"].duplex
    async with asyncio.timeout(5):
        while engine.sessions:
            await asyncio.sleep(0.05)


async def test_the_sdk_hears_the_model_speak_while_the_user_talks(server: ServedApp) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.realtime.connect(model="gpt-realtime") as conn,
    ):
        seen: list[str] = []

        async def until(kind: str, within_s: float = 20) -> dict[str, Any]:
            async with asyncio.timeout(within_s):
                async for event in conn:
                    seen.append(event.type)
                    if event.type == kind:
                        return event.model_dump()
            raise AssertionError(f"the connection ended before {kind}")

        await until("session.created")
        created = await until("response.created")
        await until("response.output_audio.delta")
        said = await until("response.output_audio_transcript.delta")  # its text stream's words
        assert said["delta"].strip() and said["response_id"] == created["response"]["id"]
        pcm = question(48_000)[::2].astype("<i2")  # 24 kHz
        step = 24_000 * 2 // 10
        raw = pcm.tobytes()
        for begin in range(0, len(raw), step):  # talked over, in real time
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(raw[begin : begin + step]).decode()
            )
            await asyncio.sleep(0.1)
        await until("input_audio_buffer.speech_stopped")
        assert "input_audio_buffer.speech_started" in seen
        assert "response.done" not in seen  # the model speaks on: no turn of ours cut it
        await conn.response.create()
        error = await until("error")
        assert error["error"]["code"] == "duplex_model_decides"
        await conn.response.cancel()
        done = await until("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["id"] == created["response"]["id"]
        quiet_from = len(seen)
        await asyncio.sleep(1.0)
        await conn.input_audio_buffer.append(audio=base64.b64encode(bytes(4800)).decode())
        await asyncio.sleep(0.3)
        # the toy model never falls quiet, so it stays silenced: nothing more is said
        assert "response.output_audio.delta" not in seen[quiet_from:]
    await engine_idle(server)


async def test_a_webrtc_call_carries_the_models_voice_and_its_turn(server: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        caller = Caller(http)
        try:
            assert (await caller.connect(AUTH)).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.created")
            began = time.monotonic()
            created = await caller.wait_for(lambda e: e["type"] == "response.created")
            await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.started")
            caller.mic.say(question(16_000))
            await caller.wait_for(
                lambda e: e["type"] == "input_audio_buffer.speech_started", within_s=20
            )
            async with asyncio.timeout(10):  # the model's voice on the track, going on
                while len(caller.loud_since(began)) < 25:
                    await asyncio.sleep(0.1)
            caller.send({"type": "response.cancel"})
            done = await caller.wait_for(lambda e: e["type"] == "response.done")
            assert done["response"]["id"] == created["response"]["id"]
            assert done["response"]["status"] == "cancelled"
            await asyncio.sleep(0.5)
            hushed = time.monotonic()
            await asyncio.sleep(1.0)
            assert len(caller.loud_since(hushed)) <= 3  # silent at once (a packet in flight)
            await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup", headers=AUTH)
        finally:
            await caller.close()  # after a hang-up: a drop alone keeps the session to re-attach
    await engine_idle(server)
