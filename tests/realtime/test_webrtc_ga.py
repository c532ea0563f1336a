"""The WebRTC data channel speaks the WebSocket's GA sequence: one spoken turn over each
transport (a real aiortc caller, a raw WebSocket client) against one real uvicorn server
with a fake model engine, compared type by type; every data-channel event validates
against the openai SDK's server event types."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import connect

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

KEY = "sk-test-parley-rtc-ga"
AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTION = "What is the weather like today?"

ONE_TRANSPORT = {"response.output_audio.delta"} | {
    f"output_audio_buffer.{news}" for news in ("started", "stopped", "cleared")
}
"""Audio deltas are the WebSocket's (WebRTC's audio is its track); the playout news is
WebRTC's (a WebSocket client plays the audio itself)."""
TIMING = {
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
}
"""Partial transcripts come at the pauses the turn detector heard, which the two
transports' audio (Opus over RTP, PCM in appends) may place differently; the final one at
speech_stopped when the words at the pause were ready by then, else with the answer."""

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 1500, realtime_factor: 4.0")
    async with served_app(Settings(pipeline=graph, api_key=KEY, max_sessions=2), redis_url) as s:
        yield s


def utterance(rate: int) -> np.ndarray:
    speech = trim_silence(speak(QUESTION, rate=rate))
    return np.concatenate([silence(300, rate), speech, silence(900, rate)])


def shared(types: list[str]) -> list[str]:
    """The types up to the first `response.done`, less those only one transport has."""
    end = types.index("response.done") + 1
    return [t for t in types[:end] if t not in ONE_TRANSPORT | TIMING]


async def websocket_turn(server: ServedApp) -> list[str]:
    url = f"{server.ws_url}/v1/realtime?model=parley"
    async with connect(url, additional_headers=AUTH, proxy=None) as ws:
        client = RecordingClient(ws)
        await client.wait_type("session.created")
        await client.append(utterance(24_000))
        await client.wait_type("response.done", within_s=30)
        await client.until_quiet(0.5)
    return [e["type"] for e in client.events]


async def webrtc_turn(server: ServedApp) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        caller = Caller(http)
        try:
            assert (await caller.connect(AUTH)).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.created")
            caller.mic.say(utterance(16_000))
            await caller.wait_for(lambda e: e["type"] == "response.done", within_s=30)
            await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped")
        finally:
            await caller.close()
    return caller.events


async def test_a_spoken_turn_has_the_same_ga_sequence_on_both_transports(
    server: ServedApp,
) -> None:
    over_websocket = await websocket_turn(server)
    events = await webrtc_turn(server)
    over_webrtc = [e["type"] for e in events]
    assert shared(over_webrtc) == shared(over_websocket)
    for expected in (
        "conversation.item.added",
        "conversation.item.done",
        "rate_limits.updated",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
    ):
        assert expected in over_webrtc, expected
    assert "response.output_audio.delta" not in over_webrtc
    for event in events:
        SERVER_EVENT.validate_python(event)
    done = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
    assert done["transcript"].startswith("Hello there")
    started = next(e for e in events if e["type"] == "output_audio_buffer.started")
    created = next(e for e in events if e["type"] == "response.created")
    assert started["response_id"] == created["response"]["id"]
