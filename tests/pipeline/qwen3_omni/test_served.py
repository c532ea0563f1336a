"""The whole path: a spoken turn over the OpenAI Realtime WebSocket (the official SDK, a real
uvicorn on loopback) to the tiny Qwen3-Omni graph and back as streamed speech."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import numpy as np
from openai import AsyncOpenAI

from loadtest.speech import silence, speak, trim_silence
from tests.realtime.apps import served_app
from web.settings import Settings

from .conftest import graph_yaml

KEY = "sk-test-parley-qwen3-omni"
RATE = 24_000


async def test_a_spoken_turn_over_the_openai_websocket_is_answered_with_speech(
    tmp_path: Path, redis_url: str
) -> None:
    graph = tmp_path / "qwen3_omni_tiny.yaml"
    graph.write_text(graph_yaml(tokens=8, frames=15, first_chunk=3, chunk=6))
    settings = Settings(pipeline=str(graph), api_key=KEY, max_sessions=2)
    speech = trim_silence(speak("Tell me something.", rate=RATE))
    pcm = np.concatenate([silence(300, RATE), speech, silence(900, RATE)])
    async with (
        served_app(settings, redis_url) as served,
        AsyncOpenAI(api_key=KEY, base_url=f"{served.http_url}/v1") as client,
        client.realtime.connect(model="parley") as conn,
    ):
        assert (await conn.recv()).type == "session.created"
        step = RATE // 10
        for start in range(0, len(pcm), step):
            chunk = pcm[start : start + step].astype("<i2").tobytes()
            await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        events: list[Any] = []
        async with asyncio.timeout(40):
            while not events or events[-1].type != "response.done":
                events.append(await conn.recv())
    assert events[-1].response.status == "completed", events[-1]
    transcript = "".join(
        e.delta for e in events if e.type == "response.output_audio_transcript.delta"
    )
    assert transcript.startswith("tok")  # placeholder words from random weights
    audio = np.frombuffer(
        b"".join(
            base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
        ),
        dtype="<i2",
    )
    # 15 frames of 80 ms, less the decoder's causal trim per chunk; noise-like, not silence
    assert 0.9 * RATE < len(audio) <= 1.2 * RATE
    assert np.abs(audio).max() > 1000


async def test_speaking_over_the_answer_aborts_it_in_every_stage(
    tmp_path: Path, redis_url: str
) -> None:
    graph = tmp_path / "qwen3_omni_tiny.yaml"
    # a reply long enough to be still in the making when the user barges in
    graph.write_text(graph_yaml(tokens=3000, frames=400, first_chunk=3, chunk=10))
    settings = Settings(pipeline=str(graph), api_key=KEY, max_sessions=2)
    question = np.concatenate(
        [silence(300, RATE), trim_silence(speak("Tell me a story.", rate=RATE)), silence(900, RATE)]
    )
    interruption = np.concatenate(
        [trim_silence(speak("Hold on, stop.", rate=RATE)), silence(900, RATE)]
    )
    async with (
        served_app(settings, redis_url) as served,
        AsyncOpenAI(api_key=KEY, base_url=f"{served.http_url}/v1") as client,
        client.realtime.connect(model="parley") as conn,
    ):
        pipeline = served.services.pipeline
        assert pipeline is not None

        async def until(name: str) -> Any:
            async with asyncio.timeout(30):
                while (event := await conn.recv()).type != name:
                    pass
                return event

        await conn.input_audio_buffer.append(audio=b64(question))
        await until("response.output_audio.delta")
        assert pipeline.active_requests() > 0  # still thinking and talking
        await conn.input_audio_buffer.append(audio=b64(interruption))
        done = await until("response.done")
        assert done.response.status == "cancelled"
        await until("response.created")  # the interruption's own answer: stop it too
        await conn.response.cancel()
        await until("response.done")
        async with asyncio.timeout(10):  # both answers aborted in every stage: nothing held
            while pipeline.active_requests() > 0:
                await asyncio.sleep(0.02)


def b64(pcm: np.ndarray[Any, Any]) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode()
