"""GPT-Live over WebRTC against the embedded cascade (Whisper, SmolLM2, Piper on the CPU):
a spoken question in on the track, its transcript and the answer's on the data channel,
the answer's audio out on the track, and a hang-up that ends the session. (A duplex model
over WebRTC: tests/realtime/test_duplex_realtime.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from loadtest.webrtc_client import Caller
from tests.frameworks.conftest import QUESTION, spoken
from web.app import Services
from web.settings import Settings

from .apps import running_app

SESSION = {"model": "gpt-live-1", "instructions": "Answer in one short sentence."}


@pytest.fixture
async def app(redis_url: str) -> AsyncIterator[Starlette]:
    async with running_app(Settings(pipeline="cascade", max_sessions=2), redis_url) as running:
        yield running


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_spoken_question_gets_a_spoken_answer_and_both_transcripts(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    caller = Caller(http)
    try:
        assert (await caller.connect_live(SESSION)).status_code == 201
        await caller.wait_for(lambda e: e["type"] == "session.started")
        caller.mic.say(spoken(QUESTION, 16_000))
        await caller.wait_for(lambda e: e["type"] == "session.output_transcript.delta", 60)
        heard = "".join(
            e["delta"] for e in caller.events if e["type"] == "session.input_transcript.delta"
        )
        assert "capital" in heard.lower() and "france" in heard.lower(), heard
        await asyncio.sleep(2.0)  # some of the answer plays
        said = [e for e in caller.events if e["type"] == "session.output_transcript.delta"]
        assert "".join(e["delta"] for e in said).strip()
        assert all(0 <= e["start_ms"] <= e["end_ms"] for e in said)
        assert len(caller.loud_since(0)) > 25  # half a second and more of answer audio
        assert "session.output_audio.delta" not in caller.types()
        assert "error" not in caller.types(), caller.events
    finally:
        await caller.close()  # the hang-up: the peer connection closes
    services: Services = app.state.services
    assert services.calls is not None and services.manager is not None
    async with asyncio.timeout(10):
        while len(services.calls) or len(services.manager):
            await asyncio.sleep(0.05)
