"""A turn's camera frames are those of its own moment, on every transport that carries
video: a camera shows red, then blue, and each question about the colour gets the frames
of the moment it was asked (sessions/frame_window.py).

One server under uvicorn with the fake engine; the engine's `requests` show which frames
reached the model. A real aiortc caller with a camera (WebRTC), a raw OpenAI Realtime
WebSocket client sending `input_image`s, and a vLLM-Omni video chat client.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.asyncio.client import connect

from loadtest.speech import silence, speak, trim_silence
from loadtest.webrtc_client import Caller
from pipeline.types import PipelineRequest
from realtime.video_chat.video_input import session_settings
from realtime.video_chat.video_messages import SessionConfigMessage, parse_message
from sessions.frame_window import LOOKBACK_MS
from tests.fakes.fake_engine import FakeEngine
from tests.realtime.apps import ServedApp, fake_graph_file, served_app
from tests.realtime.clients import RecordingClient
from web.settings import Settings

RED = (230, 20, 20)
BLUE = (20, 20, 230)
PAST_THE_WINDOW_S = LOOKBACK_MS / 1000 + 0.2
"""How long a picture must be on screen before a question for the one before it to be
out of the question's window."""


@pytest.fixture
async def server(tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = fake_graph_file(tmp_path, "audio_ms: 400, chunk_ms: 100, realtime_factor: 4.0")
    async with served_app(Settings(pipeline=graph, max_sessions=4), redis_url) as served:
        yield served


def engine_of(server: ServedApp) -> FakeEngine:
    pipeline: Any = server.services.pipeline
    engine = pipeline.engines["model"]
    assert isinstance(engine, FakeEngine)
    return engine


def jpeg(rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), rgb).save(out, "JPEG")
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def colours(request: PipelineRequest) -> list[str]:
    """The colour of each frame the model was sent."""
    named = []
    for frame in request.frames:
        with Image.open(io.BytesIO(frame.image)) as image:
            pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
        r, _, b = pixels.reshape(-1, 3).mean(axis=0)
        named.append("red" if r > 2 * b else "blue" if b > 2 * r else "other")
    return named


async def next_request(engine: FakeEngine, count: int, within_s: float = 15.0) -> PipelineRequest:
    """The engine's `count`-th answer request, once it has come."""
    async with asyncio.timeout(within_s):
        while len(engine.requests) < count:
            await asyncio.sleep(0.02)
    return engine.requests[count - 1]


async def test_webrtc_camera_turns_get_the_frames_of_their_moment(server: ServedApp) -> None:
    engine = engine_of(server)
    question = trim_silence(speak("What colour is this?"))
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        caller = Caller(http, camera=True)
        try:
            assert caller.camera is not None
            caller.camera.colour = RED
            assert (await caller.connect()).status_code == 201
            created = await caller.wait_for(lambda e: e["type"] == "session.created")
            session = server.manager.get(created["session"]["id"])
            async with asyncio.timeout(10):
                while await session.frames.count() < 1:  # the camera's first frame
                    await asyncio.sleep(0.05)
            caller.mic.say(question)
            assert set(colours(await next_request(engine, 1))) == {"red"}
            await caller.wait_for(lambda e: e["type"] == "output_audio_buffer.stopped")

            caller.camera.colour = BLUE
            async with asyncio.timeout(10):
                while await session.frames.count() < 2:  # blue is in the cache
                    await asyncio.sleep(0.05)
            caller.mic.say(question)
            assert set(colours(await next_request(engine, 2))) == {"blue"}
        finally:
            await caller.close()


def utterance() -> np.ndarray:
    """A question at 24 kHz, with the silence that ends the turn after it."""
    speech = trim_silence(speak("What colour is this?", rate=24_000))
    return np.concatenate([silence(300, 24_000), speech, silence(900, 24_000)])


def image_item(rgb: tuple[int, int, int]) -> dict[str, Any]:
    url = "data:image/jpeg;base64," + b64(jpeg(rgb))
    content = [{"type": "input_image", "image_url": url}]
    return {"type": "conversation.item.create", "item": {"role": "user", "content": content}}


async def test_openai_websocket_images_go_with_the_turn_they_were_sent_for(
    server: ServedApp,
) -> None:
    engine = engine_of(server)
    pcm = utterance()
    async with connect(f"{server.ws_url}/v1/realtime?model=parley") as ws:
        client = RecordingClient(ws)
        await client.wait_type("session.created")
        await client.send(image_item(RED))
        await client.append(pcm)  # server VAD ends the turn and answers
        await client.wait_type("response.done")
        assert colours(engine.requests[-1]) == ["red"]

        await asyncio.sleep(PAST_THE_WINDOW_S)  # red was sent long before the next question
        await client.send(image_item(BLUE))
        await client.append(pcm)
        await client.wait_type("response.done")
        assert colours(engine.requests[-1]) == ["blue"]

    # Manual turns: an image sent after the turn's audio was committed is newer than the
    # turn's window, and the window holds none: the turn gets the latest frames.
    async with connect(f"{server.ws_url}/v1/realtime?model=parley") as ws:
        client = RecordingClient(ws)
        await client.wait_type("session.created")
        await client.send({"type": "session.update", "session": {"turn_detection": None}})
        await client.wait_type("session.updated")
        await client.append(pcm)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.wait_type("input_audio_buffer.committed")
        await asyncio.sleep(0.05)  # the image comes a moment after the turn ended
        await client.send(image_item(BLUE))
        await client.send({"type": "response.create"})
        await client.wait_type("response.done")
        assert colours(engine.requests[-1]) == ["blue"]


async def test_the_video_chat_stream_answers_from_the_frames_of_the_query(
    server: ServedApp,
) -> None:
    engine = engine_of(server)
    speech = trim_silence(speak("What colour is this?"))
    chunks = [b64(speech[i : i + 1600].tobytes()) for i in range(0, len(speech), 1600)]
    config = {"type": "session.config", "modalities": ["text"], "parley": {"extras": True}}
    async with connect(f"{server.ws_url}/v1/video/chat/stream", max_size=None) as ws:
        client = RecordingClient(ws)
        await client.send(config)
        await client.wait_type("session.created")

        async def ask(rgb: tuple[int, int, int]) -> PipelineRequest:
            for _ in range(3):  # a camera at a few frames a second
                await client.send({"type": "video.frame", "data": b64(jpeg(rgb))})
            for chunk in chunks:
                await client.send({"type": "audio.chunk", "data": chunk})
            await client.send({"type": "video.query", "text": "What colour is this?"})
            await client.wait_type("response.text.done")
            return engine.requests[-1]

        assert set(colours(await ask(RED))) == {"red"}
        await asyncio.sleep(PAST_THE_WINDOW_S)
        assert set(colours(await ask(BLUE))) == {"blue"}


def test_a_video_chat_client_that_names_a_sampling_strategy_keeps_vllm_omnis_rule() -> None:
    """vLLM-Omni's rule, num_frames from the whole buffer (FrameCache.sample without a
    window, tests/sessions/test_buffers.py), where the client asks for a strategy."""

    def frame_window(**config: Any) -> Any:
        message = parse_message(json.dumps({"type": "session.config", **config}))
        assert isinstance(message, SessionConfigMessage)
        return session_settings(message)["video"]["frame_window"]

    assert frame_window() == "turn"
    assert frame_window(parley={"extras": True}) == "turn"
    assert frame_window(sampling_strategy="uniform") == "cache"
    assert frame_window(sampling_strategy="latest_frames", num_sample_frames=2) == "cache"
