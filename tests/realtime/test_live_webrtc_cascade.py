"""GPT-Live over WebRTC against the embedded cascade (Whisper, SmolLM2, Piper on the CPU):
a spoken question in on the track, its transcript and the answer's on the data channel,
the answer's audio out on the track, and a hang-up that ends the session; and against a
full-duplex model (`moshi_tiny`), which hears the track and speaks on it, and refuses a
session when it is full."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from loadtest.webrtc_client import Caller
from pipeline.duplex import duplex_model
from tests.frameworks.conftest import QUESTION, spoken
from web.app import Services
from web.settings import Settings

from .apps import asgi_client, running_app

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


@pytest.fixture
async def duplex_app(redis_url: str) -> AsyncIterator[Starlette]:
    async with running_app(Settings(pipeline="moshi_tiny", max_sessions=2), redis_url) as app:
        yield app


@pytest.mark.slow
async def test_a_duplex_model_hears_the_track_and_speaks_on_it(
    duplex_app: Starlette,
) -> None:
    services: Services = duplex_app.state.services
    assert duplex_model(services.pipeline) is not None
    engine = duplex_app.state.services.pipeline.engines["moshi"].duplex
    async with asgi_client(duplex_app) as http:
        caller = Caller(http)
        try:
            assert (await caller.connect_live(SESSION)).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.started")
            caller.mic.say(spoken(QUESTION, 16_000))
            async with asyncio.timeout(20):
                while len(caller.loud_since(0)) < 25:  # the model's voice on the track
                    await asyncio.sleep(0.1)
            assert engine.sessions == 1
        finally:
            await caller.close()
        assert services.calls is not None and services.manager is not None
        async with asyncio.timeout(10):
            while len(services.calls) or len(services.manager) or engine.sessions:
                await asyncio.sleep(0.05)
        # A full model refuses at once, with a reason, and nothing is made.
        held = [engine.open(f"held-{k}") for k in range(engine.rows)]
        turned_away = Caller(http)
        try:
            refused = await turned_away.connect_live(SESSION)
        finally:
            await turned_away.close()
            for k in range(len(held)):
                engine.leave(f"held-{k}")
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "session_limit"
        assert len(services.calls) == 0 and len(services.manager) == 0
