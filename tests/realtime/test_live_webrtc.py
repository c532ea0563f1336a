"""GPT-Live over WebRTC (`POST /v1/live/sessions` with a WebRTC transport), end to end: a
real aiortc caller and the app in process (signaling through ASGI, media and the data
channel over loopback), with the fake model engine behind a graph file, and once with the
embedded cascade (tests/realtime/test_live_webrtc_cascade.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from web.app import Services

from .apps import fake_app

KEY = "sk-test-parley-live-webrtc"
AUTH = {"Authorization": f"Bearer {KEY}"}
SESSION: dict[str, Any] = {"model": "gpt-live-1", "instructions": "You are terse."}


@pytest.fixture
async def app(tmp_path: Path, redis_url: str) -> AsyncIterator[Starlette]:
    async with fake_app(
        tmp_path, redis_url, "audio_ms: 2000, realtime_factor: 4.0", max_sessions=2, api_key=KEY
    ) as running:
        yield running


@pytest.fixture
async def caller(http: httpx.AsyncClient) -> AsyncIterator[Caller]:
    c = Caller(http)
    yield c
    await c.close()


def question() -> np.ndarray:
    return np.concatenate([silence(300), trim_silence(speak("What is the weather like today?"))])


async def nothing_left(app: Starlette) -> None:
    """The server lets go of every call and session (within a few seconds)."""
    services: Services = app.state.services
    assert services.calls is not None and services.manager is not None
    async with asyncio.timeout(10):
        while len(services.calls) or len(services.manager):
            await asyncio.sleep(0.05)


async def test_a_spoken_turn_over_the_track_with_transcripts_on_the_channel(
    caller: Caller, app: Starlette
) -> None:
    response = await caller.connect_live(SESSION, AUTH)
    assert response.status_code == 201, response.text
    answer = response.json()
    assert answer["transport"]["type"] == "webrtc"
    assert answer["session"]["id"].startswith("sess_")
    started = await caller.wait_for(lambda e: e["type"] == "session.started")
    assert caller.events[0] is started  # the first message on the channel
    assert started["session"]["id"] == answer["session"]["id"]
    assert started["session"]["model"] == "gpt-live-1"
    assert "format" not in started["session"].get("audio", {})  # negotiated on the track

    caller.send({"type": "session.instructions.append", "content": "Metric.", "event_id": "i-1"})
    acked = await caller.wait_for(lambda e: e["type"] == "session.instructions.appended")
    assert acked["client_event_id"] == "i-1" and acked["start_ms"] >= 0
    caller.send({"type": "session.input_audio.append", "audio": "AAAA", "event_id": "a-1"})
    refused = await caller.wait_for(lambda e: e["type"] == "error")
    assert refused["client_event_id"] == "a-1"
    assert "media track" in refused["error"]["message"]

    caller.mic.say(question())
    heard = await caller.wait_for(lambda e: e["type"] == "session.input_transcript.delta")
    assert heard["delta"].startswith("heard")  # where the speech began on the timeline:
    assert heard["end_ms"] >= heard["start_ms"] >= 200  # after the 300 ms of silence
    said = await caller.wait_for(lambda e: e["type"] == "session.output_transcript.delta")
    assert said["delta"] and said["start_ms"] <= said["end_ms"]
    await asyncio.sleep(1.0)
    assert len(caller.loud_since(0)) > 25  # half a second and more of answer on the track
    assert "session.output_audio.delta" not in caller.types()  # audio travels on the track

    caller.send({"type": "session.close", "event_id": "c-1"})
    closed = await caller.wait_for(lambda e: e["type"] == "session.closed", within_s=5)
    assert closed["reason"] == "close_requested"
    assert closed["session"]["id"] == answer["session"]["id"]
    await nothing_left(app)


async def test_a_peer_that_hangs_up_ends_its_session(caller: Caller, app: Starlette) -> None:
    assert (await caller.connect_live(SESSION, AUTH)).status_code == 201
    await caller.wait_for(lambda e: e["type"] == "session.started")
    await caller.pc.close()
    await nothing_left(app)


async def test_the_data_channel_permissions_hold_both_ways(caller: Caller, app: Starlette) -> None:
    session = {
        **SESSION,
        "client": {
            "data_channel": {
                "allowed_client_events": ["session.thinking.append", "session.close"],
                "allowed_server_events": [
                    {"type": "session.started"},
                    {"type": "error"},
                    {"type": "session.instructions.appended"},
                    {"type": "session.closed"},
                ],
            }
        },
    }
    assert (await caller.connect_live(session, AUTH)).status_code == 201
    await caller.wait_for(lambda e: e["type"] == "session.started")
    services: Services = app.state.services
    assert services.manager is not None and caller.session_id is not None
    history = services.manager.get(caller.session_id).history

    # Not allowed to send: refused, and the session never hears of it.
    caller.send({"type": "session.instructions.append", "content": "Obey.", "event_id": "i-1"})
    refused = await caller.wait_for(lambda e: e["type"] == "error")
    assert refused["client_event_id"] == "i-1"
    assert refused["error"]["code"] == "event_not_allowed"
    assert refused["error"]["param"] == "type"
    # Allowed to send, but its acknowledgement is not the page's to read.
    caller.send({"type": "session.thinking.append", "content": "Quiet.", "event_id": "t-1"})
    async with asyncio.timeout(5):
        while not [item for item in await history.items() if item.text == "Quiet."]:
            await asyncio.sleep(0.02)
    assert not [item for item in await history.items() if item.text == "Obey."]
    caller.send({"type": "session.close"})
    await caller.wait_for(lambda e: e["type"] == "session.closed", within_s=5)
    assert set(caller.types()) == {"session.started", "error", "session.closed"}
    await nothing_left(app)


BAD_OFFER = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 RTP/SAVP 0\r\n"


def req(session: dict[str, Any] | None = None, sdp: str = "v=0", **more: Any) -> dict[str, Any]:
    """A create body: the test session (or `session`) and a WebRTC transport."""
    return {"session": session or SESSION, "transport": {"type": "webrtc", "sdp": sdp}, **more}


ONLY_RESPONSES = {"data_channel": {"allowed_server_events": [{"type": "response.event"}]}}


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"session": SESSION}, "missing_required_parameter", "transport"),
        (req(x=1), "unknown_parameter", "x"),
        ({**req(), "transport": {"type": "ws", "sdp": "v=0"}}, "invalid_value", "transport.type"),
        ({**req(), "transport": {"type": "webrtc"}}, "missing_required_parameter", "transport.sdp"),
        (req({**SESSION, "voices": 1}), "unknown_parameter", "session.voices"),
        (req({"instructions": "x"}), "missing_required_parameter", "session.model"),
        (req({**SESSION, "audio": {"format": {"type": "audio/pcm"}}}), "unknown_parameter",
         "session.audio.format"),
        (req({**SESSION, "client": ONLY_RESPONSES}), "invalid_value", None),
        (req(sdp="hello"), "invalid_offer", "transport.sdp"),
        (req(sdp=BAD_OFFER), "invalid_offer", "transport.sdp"),
        ([], "invalid_type", None),
    ],
)  # fmt: skip
async def test_bad_requests_are_refused_clearly_and_leave_nothing(
    http: httpx.AsyncClient, app: Starlette, body: Any, code: str, param: str | None
) -> None:
    response = await http.post("/v1/live/sessions", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert error["message"]
    await nothing_left(app)


async def test_no_key_no_json_and_not_json_are_refused(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    body = {"session": SESSION, "transport": {"type": "webrtc", "sdp": "v=0"}}
    unauthorised = await http.post("/v1/live/sessions", json=body)
    assert unauthorised.status_code == 401
    assert unauthorised.json()["error"]["code"] == "invalid_api_key"
    as_sdp = await http.post(
        "/v1/live/sessions", content="v=0", headers={**AUTH, "Content-Type": "application/sdp"}
    )
    assert as_sdp.status_code == 415
    broken = await http.post(
        "/v1/live/sessions", content="{", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    await nothing_left(app)


async def test_a_muted_microphone_is_heard_as_silence(caller: Caller, app: Starlette) -> None:
    assert (await caller.connect_live(SESSION, AUTH)).status_code == 201
    await caller.wait_for(lambda e: e["type"] == "session.started")
    caller.send({"type": "session.input_audio.mute", "event_id": "m-1"})
    muted = await caller.wait_for(lambda e: e["type"] == "session.input_audio.muted")
    assert muted["client_event_id"] == "m-1"
    caller.mic.say(question())
    await asyncio.sleep(2.5)  # the question and the silence that would end its turn
    assert "session.input_transcript.delta" not in caller.types()
    caller.send({"type": "session.input_audio.unmute", "event_id": "u-1"})
    await caller.wait_for(lambda e: e["type"] == "session.input_audio.unmuted")
    caller.mic.say(question())
    await caller.wait_for(lambda e: e["type"] == "session.input_transcript.delta")
