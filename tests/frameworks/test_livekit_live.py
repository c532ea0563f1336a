"""LiveKit Agents' GPT-Live model (`GPTLiveModel`, a duplex model) with its defaults, only
`base_url` and `api_key` pointed at Parley (voice "marin", `responses` delegation, with no
tools or with a function tool), used through its session as an AgentSession would, without
a LiveKit room: configured, fed a spoken question at real-time pace, its audio drained."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import llm
from livekit.agents.llm._realtime.gpt_live import GPTLiveModel

from tests.realtime.apps import ServedApp

from .conftest import INSTRUCTIONS, KEY, QUESTION, Records, push_in_real_time, spoken
from .test_livekit import get_weather

RATE = 24_000


@pytest.mark.slow
async def test_livekit_gpt_live_hears_a_spoken_question_and_plays_the_answer(
    parley: ServedApp, warnings_logged: Records
) -> None:
    model = GPTLiveModel(base_url=f"{parley.http_url}/v1", api_key=KEY)
    session = model.session()
    heard: list[str] = []
    said: list[Any] = []
    errors: list[Any] = []
    session.on("input_audio_transcription_completed", lambda e: heard.append(e.transcript))
    session.on("transcript_delta", said.append)
    session.on("error", errors.append)
    audio_s = 0.0

    async def drain() -> None:
        nonlocal audio_s
        async for frame in session.audio_stream:
            audio_s += frame.frame.duration

    try:
        async with asyncio.TaskGroup() as tasks:
            drainer = tasks.create_task(drain())
            await session._update_session(instructions=INSTRUCTIONS, tools=[])

            async def push(data: bytes) -> None:
                session.push_audio(rtc.AudioFrame(data, RATE, 1, len(data) // 2))

            await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
            async with asyncio.timeout(30):
                while audio_s < 0.5 or not said:
                    await asyncio.sleep(0.05)
            drainer.cancel()
    finally:
        await session.aclose()
        await model.aclose()
    assert not errors, errors
    assert any(word in " ".join(heard).lower() for word in ("capital", "france")), heard
    assert "".join(d.text for d in said).strip()
    assert all(d.start_ms is not None and d.start_ms <= d.end_ms for d in said)
    assert not warnings_logged.lines("livekit"), warnings_logged.lines()
    assert isinstance(said[0], llm.DuplexOutputTranscriptDelta)


@pytest.mark.slow
async def test_livekit_gpt_live_delegates_a_function_call_and_speaks_its_result(
    parley: ServedApp, warnings_logged: Records
) -> None:
    """Its default `responses` delegation with a `@function_tool`: the call arrives as a
    `function_call` event, the output goes back as the session's history grows (what an
    AgentSession does), and the continuation is spoken with the result in it."""
    model = GPTLiveModel(base_url=f"{parley.http_url}/v1", api_key=KEY)
    session = model.session()
    calls: list[llm.FunctionCall] = []
    said: list[Any] = []
    errors: list[Any] = []
    session.on("function_call", calls.append)
    session.on("transcript_delta", said.append)
    session.on("error", errors.append)

    async def drain() -> None:
        async for _ in session.audio_stream:
            pass

    try:
        async with asyncio.TaskGroup() as tasks:
            drainer = tasks.create_task(drain())
            await session._update_session(instructions=INSTRUCTIONS, tools=[get_weather])

            async def push(data: bytes) -> None:
                session.push_audio(rtc.AudioFrame(data, RATE, 1, len(data) // 2))

            await push_in_real_time(push, spoken("What is the weather in Paris?", RATE), RATE)
            async with asyncio.timeout(30):
                while not calls:
                    await asyncio.sleep(0.05)
            call = calls[0]
            city = json.loads(call.arguments)["city"]
            output = llm.FunctionCallOutput(
                name=call.name, call_id=call.call_id, output=await get_weather(city), is_error=False
            )
            await session._update_session(chat_ctx=llm.ChatContext(items=[output]))
            async with asyncio.timeout(30):
                while not any(w in text(said) for w in ("sunny", "21")):
                    await asyncio.sleep(0.05)
            drainer.cancel()
    finally:
        await session.aclose()
        await model.aclose()
    assert not errors, errors
    assert call.name == "get_weather" and "paris" in city.lower()


def text(deltas: list[Any]) -> str:
    return "".join(d.text for d in deltas).lower()
