"""WebRTC calls end to end: a real aiortc caller and the real server, over loopback.

The server runs the app in process (signaling through ASGI), with a fake model engine behind
a graph file, so answers are quick and always audible. Media and the data channel are real
aiortc peer connections on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from web.app import Services

from .apps import fake_app


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(
        tmp_path, redis_url, "audio_ms: 6000, realtime_factor: 4.0", max_sessions=4
    ) as running:
        yield running


@pytest.fixture
async def caller(http: httpx.AsyncClient) -> AsyncIterator[Caller]:
    c = Caller(http)
    yield c
    await c.close()


def question() -> np.ndarray:
    return np.concatenate([silence(300), trim_silence(speak("What is the weather like today?"))])


@pytest.mark.slow
async def test_a_spoken_question_gets_an_audible_answer_and_transcript_events(
    caller: Caller, app: Starlette
) -> None:
    response = await caller.connect()
    assert response.status_code == 201, response.text
    assert response.headers["content-type"].startswith("application/sdp")
    await caller.wait_for(lambda e: e["type"] == "session.created")
    caller.mic.say(question())
    done = await caller.wait_for(lambda e: e["type"] == "response.done", within_s=30)
    assert done["response"]["status"] == "completed"
    types = caller.types()
    for expected in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio_transcript.delta",
        "output_audio_buffer.started",
    ):
        assert expected in types, expected
    assert "response.output_audio.delta" not in types  # audio travels on the track
    await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped", within_s=15)
    assert len(caller.loud_since(0)) > 100  # seconds of audible answer on the remote track
    transcript = "".join(
        e["delta"] for e in caller.events if e["type"] == "response.output_audio_transcript.delta"
    )
    assert transcript.strip().startswith("Hello there")


@pytest.mark.slow
async def test_speaking_over_the_answer_stops_it_and_truncates_the_item(caller: Caller) -> None:
    assert (await caller.connect()).status_code == 201
    caller.mic.say(question())
    await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.started", within_s=30)
    await asyncio.sleep(1.0)
    caller.mic.say(trim_silence(speak("Hold on, stop.")))
    await asyncio.sleep(0.05)
    interrupted_at = caller.mic.speech_started_at[-1]
    done = await caller.wait_for(lambda e: e["type"] == "response.done", within_s=10)
    assert done["response"]["status"] == "cancelled"
    truncated = await caller.wait_for(lambda e: e["type"] == "conversation.item.truncated")
    assert 800 <= truncated["audio_end_ms"] <= 3000
    assert "output_audio_buffer.cleared" in caller.types()
    # The old answer's audio stopped within a second of the interruption starting.
    await asyncio.sleep(0.5)
    next_reply = [e for e in caller.events if e["type"] == "response.created"][1:]
    cutoff = time.monotonic() if not next_reply else time.monotonic() - 0.5
    old_audio = [t for t in caller.loud_since(interrupted_at) if t < cutoff]
    assert not old_audio or old_audio[-1] - interrupted_at < 1.0


@pytest.mark.slow
async def test_camera_frames_reach_the_frame_cache_at_the_configured_rate(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    caller = Caller(http, camera=True)
    try:
        assert (await caller.connect()).status_code == 201
        created = await caller.wait_for(lambda e: e["type"] == "session.created")
        services: Services = app.state.services
        assert services.manager is not None
        session = services.manager.get(created["session"]["id"])
        await asyncio.sleep(3.5)
        count = await session.frames.count()
        assert 2 <= count <= 5  # 1 fps while the user is silent
    finally:
        await caller.close()


@pytest.mark.parametrize(
    ("offer", "message"),
    [
        (b"hello", "not an SDP offer"),
        (
            b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"
            b"a=fingerprint:sha-256 AA\r\n",
            "no audio m-line",
        ),
        (
            b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 RTP/SAVP 0\r\n"
            b"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:x\r\n",
            "SDES",
        ),
        (
            b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n"
            b"a=rtpmap:0 G722/8000\r\na=fingerprint:sha-256 AA\r\n",
            "no audio codec in common",
        ),
    ],
)
async def test_bad_offers_get_a_400_quickly_and_leave_nothing(
    http: httpx.AsyncClient, app: Starlette, offer: bytes, message: str
) -> None:
    started = time.monotonic()
    response = await http.post(
        "/v1/realtime/calls", content=offer, headers={"Content-Type": "application/sdp"}
    )
    assert time.monotonic() - started < 0.2
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    services: Services = app.state.services
    assert services.calls is not None and len(services.calls) == 0
    assert services.manager is not None and len(services.manager) == 0
