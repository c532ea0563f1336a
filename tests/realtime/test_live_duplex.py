"""`parley serve --pipeline moshi_tiny` over GPT-Live: a full-duplex model behind the
official SDK's `client.live`, the microphone streaming in and the model's voice streaming
out at the same time, with no turns."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from pipeline.duplex import duplex_model
from tests.realtime.apps import ServedApp, served_app
from web.settings import Settings

KEY = "sk-test-parley-duplex"
START = {"model": "gpt-live-1", "instructions": "Chat."}


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[ServedApp]:
    settings = Settings(pipeline="moshi_tiny", api_key=KEY, max_sessions=4)
    async with served_app(settings, redis_url) as served:
        yield served


def voice(seconds: float, rate: int) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 220 * t) * 8000).astype("<i2").tobytes()


async def test_the_model_hears_and_speaks_at_once_over_the_sdk(server: ServedApp) -> None:
    model = duplex_model(server.app.state.services.pipeline)
    assert model is not None
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        client.live.connect() as conn,
    ):
        await conn.session.start(session=START)  # type: ignore[arg-type]
        assert (await conn.recv()).type == "session.started"
        pcm = voice(1.2, 24_000)
        step = 24_000 * 2 // 10  # 100 ms appends, in real time

        async def speak() -> None:
            for begin in range(0, len(pcm), step):
                await conn.session.input_audio.append(
                    audio=base64.b64encode(pcm[begin : begin + step]).decode()
                )
                await asyncio.sleep(0.1)

        talking = asyncio.create_task(speak())
        audio = 0
        kinds: set[str] = set()
        async with asyncio.timeout(30):
            while audio < 24_000:  # a second of the model's voice while the user talks
                event = await conn.recv()
                kinds.add(event.type)
                if event.type == "session.output_audio.delta":
                    said = np.frombuffer(base64.b64decode(event.delta), "<i2")
                    audio += len(said) if said.any() else 0  # its voice, not silence between
        await talking
        assert "error" not in kinds, kinds
        assert "session.output_transcript.delta" in kinds  # the words of its text stream
        assert server.app.state.services.pipeline.engines["moshi"].duplex.sessions == 1
        await conn.session.close()
        async with asyncio.timeout(10):
            while (await conn.recv()).type != "session.closed":
                pass
    engine = server.app.state.services.pipeline.engines["moshi"].duplex
    async with asyncio.timeout(5):
        while engine.sessions:
            await asyncio.sleep(0.05)
    assert engine.stats.steps > 10


async def test_a_full_model_refuses_a_session_with_a_reason(server: ServedApp) -> None:
    engine = server.app.state.services.pipeline.engines["moshi"].duplex
    held = [engine.open(f"held-{k}") for k in range(engine.rows)]
    try:
        url = f"{server.ws_url}/v1/live/sessions"
        async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.send(json.dumps({"type": "session.start", "session": START}))
            error: dict[str, Any] = json.loads(await ws.recv())
            assert error["type"] == "error" and error["error"]["code"] == "session_limit"
    finally:
        for k in range(len(held)):
            engine.leave(f"held-{k}")


async def test_a_dead_frame_clock_ends_the_session_with_model_error_and_readyz_is_red(
    server: ServedApp,
) -> None:
    """The model's frame raising at every tick (a seam for a failing GPU) kills the clock:
    the client is told `model_error` and its session closes; `/readyz` names the stage and
    a new session is refused with the reason until the clock has restarted."""
    engine = server.app.state.services.pipeline.engines["moshi"].duplex
    url = f"{server.ws_url}/v1/live/sessions"
    headers = {"Authorization": f"Bearer {KEY}"}
    real = engine._frame

    def broken(heard: dict[str, Any]) -> Any:
        raise RuntimeError("the frame went wrong")

    async with (
        connect(url, additional_headers=headers) as ws,
        httpx.AsyncClient(base_url=server.http_url) as http,
    ):
        await ws.send(json.dumps({"type": "session.start", "session": START}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        engine._frame = broken
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            while not seen or seen[-1]["type"] != "session.closed":
                seen.append(json.loads(await ws.recv()))
        errors = [m["error"] for m in seen if m["type"] == "error"]
        assert [e["code"] for e in errors] == ["model_error"], seen
        assert "frame went wrong" in errors[0]["message"]
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert "frame clock died" in ready.json()["down_stages"]["moshi"]
        async with connect(url, additional_headers=headers) as refused:
            await refused.send(json.dumps({"type": "session.start", "session": START}))
            error = json.loads(await refused.recv())
            assert error["type"] == "error" and "cannot serve now" in error["error"]["message"]
        engine._frame = real
        async with asyncio.timeout(10):  # restarted in-process: ready again
            while (await http.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.1)
