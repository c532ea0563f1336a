"""The README's walk-through for a vLLM user, past the Realtime WebSocket: `parley serve
--pipeline <the vllm graph> --sip-port ...` against a real `vllm serve`, talked to over
WebRTC (an aiortc call: a spoken question, the answer's audio on the track), GPT-Live's
WebSocket (the official SDK's `client.live`: a spoken question, the answer's words and
voice) and SIP (sipp dials: a spoken question, the answer as RTP audio). vLLM's own
counter says it read each question (the call may end before its answer does: the prompt
tokens it read, not the requests it finished)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from loadtest.speech import silence, speak, trim_silence
from loadtest.vllm_server import MODEL, Vllm
from loadtest.webrtc_client import Caller
from tests.realtime.apps import ServedApp, served_app
from tests.realtime.sip.support import free_sipp_port, requires_sipp
from tests.realtime.sip.test_serve_sip import dial, the_call
from web.settings import Settings

from .realtime_turns import graph_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the server may start first

KEY = "sk-test-parley-vllm"
QUESTION = "What is the capital of France?"


@pytest.fixture
async def parley(vllm: Vllm, tmp_path: Path, redis_url: str) -> AsyncIterator[ServedApp]:
    graph = graph_for(tmp_path, url=vllm.url, model=MODEL)
    settings = Settings(pipeline=graph, api_key=KEY, max_sessions=2, sip_port=free_sipp_port())
    async with served_app(settings, redis_url) as served:
        yield served


def answer_errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The error events that concern the answer. vLLM on the CPU, Whisper and Piper share
    two cores here, and Redis may then miss its 2 s deadline: the session tells its client
    (`redis_unavailable`) and goes on, which is right, and not what these tests are about."""
    errors = [event for event in events if event["type"] == "error"]
    return [error for error in errors if error["error"].get("code") != "redis_unavailable"]


async def read_since(vllm: Vllm, before: float) -> bool:
    async with asyncio.timeout(30):
        while await asyncio.to_thread(vllm.prompt_tokens) <= before:
            await asyncio.sleep(0.2)
    return True


async def test_a_webrtc_call_hears_vllms_answer(vllm: Vllm, parley: ServedApp) -> None:
    before = vllm.prompt_tokens()
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=parley.http_url, headers=auth) as http:
        caller = Caller(http)
        try:
            assert (await caller.connect()).status_code == 201
            await caller.wait_for(lambda e: e["type"] == "session.created")
            caller.mic.say(trim_silence(speak(QUESTION, rate=16_000)))
            await caller.wait_for(
                lambda e: e["type"] == "response.output_audio_transcript.delta", 90
            )
            async with asyncio.timeout(30):
                while len(caller.loud_since(0)) <= 25:  # half a second and more of its voice
                    await asyncio.sleep(0.1)
            assert not answer_errors(caller.events)
        finally:
            await caller.close()
    assert await read_since(vllm, before)


async def test_a_gpt_live_session_hears_vllms_answer(vllm: Vllm, parley: ServedApp) -> None:
    before = vllm.prompt_tokens()
    pcm = (
        np.concatenate(
            [
                silence(300, 24_000),
                trim_silence(speak(QUESTION, rate=24_000)),
                silence(1200, 24_000),
            ]
        )
        .astype("<i2")
        .tobytes()
    )
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{parley.http_url}/v1") as client,
        client.live.connect() as conn,
    ):
        await conn.session.start(session={"model": "gpt-live-1"})
        assert (await conn.recv()).type == "session.started"
        for begin in range(0, len(pcm), 4800):
            chunk = base64.b64encode(pcm[begin : begin + 4800]).decode()
            await conn.session.input_audio.append(audio=chunk)
        words, voiced = "", 0
        async with asyncio.timeout(90):
            while not words.strip() or voiced < 12_000:  # its words, and half a second voiced
                event = await conn.recv()
                assert not answer_errors([event.model_dump()])
                if event.type == "session.output_transcript.delta":
                    words += event.delta
                elif event.type == "session.output_audio.delta":
                    audio = np.frombuffer(base64.b64decode(event.delta), "<i2")
                    voiced += int(np.count_nonzero(np.abs(audio) > 500))
        await conn.session.close()
    assert await read_since(vllm, before)


@requires_sipp
async def test_a_phone_call_hears_vllms_answer(
    vllm: Vllm, parley: ServedApp, tmp_path: Path
) -> None:
    before = vllm.prompt_tokens()
    sipp = await dial(parley, tmp_path)
    call = await the_call(parley)
    _, stderr = await sipp.communicate()
    assert sipp.returncode == 0, stderr.decode(errors="replace")
    assert call.rtp.audible_packets > 25  # the answer, as audio on the phone
    assert await read_since(vllm, before)
