"""LiveKit Agents' GPT-Live model (`GPTLiveModel`, a duplex model) with its defaults, only
`base_url` and `api_key` pointed at Parley (voice "marin", `responses` delegation, with no
tools or with a function tool), used through its session as an AgentSession would, without
a LiveKit room: configured, fed a spoken question at real-time pace, its audio drained."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import llm
from livekit.agents.llm._realtime.gpt_live import GPTLiveModel

from tests.realtime.apps import ServedApp

from .conftest import INSTRUCTIONS, KEY, LOOP, QUESTION, Records, push_in_real_time, spoken
from .test_livekit import get_weather

RATE = 24_000

pytestmark = LOOP


@dataclass
class Talk:
    """A GPTLiveModel session as an AgentSession drives it: what it said and heard, its
    errors, and how much of its audio was drained."""

    session: Any
    said: list[Any] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    audio_s: float = 0.0

    async def speak(self, text: str) -> None:
        async def push(data: bytes) -> None:
            self.session.push_audio(rtc.AudioFrame(data, RATE, 1, len(data) // 2))

        await push_in_real_time(push, spoken(text, RATE), RATE)

    async def drain(self) -> None:
        async for frame in self.session.audio_stream:
            self.audio_s += frame.frame.duration


@contextlib.asynccontextmanager
async def talking(parley: ServedApp, **options: Any) -> AsyncIterator[Talk]:
    """A session with its defaults (but `options`), its audio drained meanwhile; closed
    (and its model) on the way out."""
    model = GPTLiveModel(base_url=f"{parley.http_url}/v1", api_key=KEY, **options)
    talk = Talk(model.session())
    talk.session.on("transcript_delta", talk.said.append)
    talk.session.on("error", talk.errors.append)
    try:
        async with asyncio.TaskGroup() as tasks:
            drainer = tasks.create_task(talk.drain())
            yield talk
            drainer.cancel()
    finally:
        await talk.session.aclose()
        await model.aclose()


@pytest.mark.slow
async def test_livekit_gpt_live_hears_a_spoken_question_and_plays_the_answer(
    parley: ServedApp, warnings_logged: Records
) -> None:
    heard: list[str] = []
    async with talking(parley) as talk:
        talk.session.on("input_audio_transcription_completed", lambda e: heard.append(e.transcript))
        await talk.session._update_session(instructions=INSTRUCTIONS, tools=[])
        await talk.speak(QUESTION)
        async with asyncio.timeout(30):
            while talk.audio_s < 0.5 or not talk.said:
                await asyncio.sleep(0.05)
    said = talk.said
    assert not talk.errors, talk.errors
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
    calls: list[llm.FunctionCall] = []
    async with talking(parley) as talk:
        talk.session.on("function_call", calls.append)
        await talk.session._update_session(instructions=INSTRUCTIONS, tools=[get_weather])
        await talk.speak("What is the weather in Paris?")
        async with asyncio.timeout(30):
            while not calls:
                await asyncio.sleep(0.05)
        call = calls[0]
        city = json.loads(call.arguments)["city"]
        output = llm.FunctionCallOutput(
            name=call.name, call_id=call.call_id, output=await get_weather(city), is_error=False
        )
        await talk.session._update_session(chat_ctx=llm.ChatContext(items=[output]))
        async with asyncio.timeout(30):
            while not any(w in text(talk.said) for w in ("sunny", "21")):
                await asyncio.sleep(0.05)
    assert not talk.errors, talk.errors
    assert call.name == "get_weather" and "paris" in city.lower()


@pytest.mark.slow
async def test_livekit_gpt_live_client_delegation_is_answered_by_the_app(
    parley: ServedApp, warnings_logged: Records
) -> None:
    """`delegation="client"`: Parley's model hands the question to the app
    (`delegation_created`, with the caller's words), and the app's commentary under the
    delegation's id is said."""
    delegations: list[Any] = []
    async with talking(parley, delegation="client") as talk:
        talk.session.on("delegation_created", delegations.append)
        await talk.session._update_session(instructions=INSTRUCTIONS, tools=[])
        await talk.speak("What is the weather in Paris right now?")
        async with asyncio.timeout(30):
            while not delegations:
                await asyncio.sleep(0.05)
        delegation = delegations[0]
        async with asyncio.timeout(30):  # the acknowledgement, while the app works
            while not talk.said:
                await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)
        acknowledged = len(text(talk.said))
        talk.session.append_commentary(
            "It is sunny and 21 degrees in Paris.", delegation_id=delegation.id
        )
        for _ in range(600):  # 30 s
            if any(w in text(talk.said)[acknowledged:] for w in ("sunny", "21")):
                break
            await asyncio.sleep(0.05)
    assert any(w in text(talk.said)[acknowledged:] for w in ("sunny", "21")), text(talk.said)
    assert not talk.errors, talk.errors
    assert "paris" in delegation.pending_transcript.lower()


def text(deltas: list[Any]) -> str:
    return "".join(d.text for d in deltas).lower()
