"""LiveKit Agents drives Parley with its defaults: the OpenAI plugin's RealtimeModel with only
`base_url` and `api_key` pointed at Parley (semantic_vad, transcription on, voice "marin"),
used through its RealtimeSession as an AgentSession would, without a LiveKit room:
push_audio, update_instructions, generate_reply (which times out after 10 s unless
response.created carries back its metadata), update_chat_ctx (which waits for each item by
the client's own id) and update_tools."""

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
from livekit.plugins import openai

from tests.realtime.apps import ServedApp

from .conftest import (
    INSTRUCTIONS,
    KEY,
    LOOP,
    QUESTION,
    Records,
    live_instructions,
    push_in_real_time,
    spoken,
)

RATE = 24_000  # the plugin's own rate: frames at another rate are resampled first

pytestmark = LOOP


@dataclass
class Reply:
    """One generation as the framework hands it to an agent: its text and audio streams."""

    user_initiated: bool
    text: str = ""
    audio_s: float = 0.0
    calls: list[llm.FunctionCall] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Recorder:
    """What a RealtimeSession emits, read the way an agent reads it; the streams are drained
    by tasks of the test's TaskGroup."""

    def __init__(self, session: openai.realtime.RealtimeSession, tasks: asyncio.TaskGroup):
        self.session = session
        self.tasks = tasks
        self.replies: list[Reply] = []
        self.transcripts: list[str] = []
        self.errors: list[llm.RealtimeModelError] = []
        self.server_events: list[dict[str, Any]] = []
        session.on("generation_created", self._on_generation)
        session.on("input_audio_transcription_completed", self._on_transcript)
        session.on("error", self.errors.append)
        session.on("openai_server_event_received", self.server_events.append)

    def _on_transcript(self, event: llm.InputTranscriptionCompleted) -> None:
        self.transcripts.append(event.transcript)

    def _on_generation(self, event: llm.GenerationCreatedEvent) -> None:
        reply = Reply(event.user_initiated)
        self.replies.append(reply)
        self.tasks.create_task(self._drain(event, reply))

    async def _drain(self, event: llm.GenerationCreatedEvent, reply: Reply) -> None:
        async def calls() -> None:
            async for call in event.function_stream:
                reply.calls.append(call)

        async def messages() -> None:
            async for message in event.message_stream:
                async with asyncio.TaskGroup() as streams:
                    streams.create_task(text(message))
                    streams.create_task(audio(message))

        async def text(message: llm.MessageGeneration) -> None:
            async for delta in message.text_stream:
                reply.text += delta

        async def audio(message: llm.MessageGeneration) -> None:
            async for frame in message.audio_stream:
                reply.audio_s += frame.duration

        async with asyncio.TaskGroup() as streams:
            streams.create_task(calls())
            streams.create_task(messages())
        reply.done.set()

    def of_type(self, server_type: str) -> list[dict[str, Any]]:
        return [e for e in self.server_events if e.get("type") == server_type]


@contextlib.asynccontextmanager
async def realtime_session(parley: ServedApp) -> AsyncIterator[Recorder]:
    model = openai.realtime.RealtimeModel(base_url=f"{parley.http_url}/v1", api_key=KEY)
    try:
        async with asyncio.TaskGroup() as tasks:
            session = model.session()
            try:
                yield Recorder(session, tasks)
            finally:
                await session.aclose()
    finally:
        await model.aclose()


def no_errors(recorder: Recorder, logged: Records) -> None:
    assert not recorder.errors, recorder.errors
    assert not recorder.of_type("error"), recorder.of_type("error")
    assert not logged.lines("livekit"), logged.lines()


async def finished(reply: Reply, within_s: float = 30.0) -> Reply:
    async with asyncio.timeout(within_s):
        await reply.done.wait()
    return reply


async def first_reply(recorder: Recorder, within_s: float = 30.0) -> Reply:
    async with asyncio.timeout(within_s):
        while not recorder.replies:
            await asyncio.sleep(0.02)
    return await finished(recorder.replies[0], within_s)


@pytest.mark.slow
async def test_a_spoken_question_is_answered_with_audio_and_transcripts(
    parley: ServedApp, warnings_logged: Records
) -> None:
    async with realtime_session(parley) as recorder:
        await recorder.session.update_instructions(INSTRUCTIONS)

        async def push(data: bytes) -> None:
            samples = len(data) // 2
            recorder.session.push_audio(rtc.AudioFrame(data, RATE, 1, samples))

        await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
        assert live_instructions(parley) == [INSTRUCTIONS]
        reply = await first_reply(recorder)
        await asyncio.sleep(0.3)
    updated = recorder.of_type("session.updated")[-1]["session"]
    assert updated["instructions"] == INSTRUCTIONS
    assert updated["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    heard = " ".join(recorder.transcripts).lower()
    assert any(word in heard for word in ("capital", "france")), heard
    assert reply.text.strip() and reply.audio_s > 0.5, reply
    assert not reply.user_initiated
    no_errors(recorder, warnings_logged)


@pytest.mark.slow
async def test_generate_reply_greets(parley: ServedApp, warnings_logged: Records) -> None:
    async with realtime_session(parley) as recorder:
        await recorder.session.update_instructions(INSTRUCTIONS)
        created = await recorder.session.generate_reply(
            instructions="Greet the user and offer your help."
        )
        assert created.user_initiated
        reply = await first_reply(recorder)
    assert reply.user_initiated
    assert reply.text.strip() and reply.audio_s > 0.5, reply
    no_errors(recorder, warnings_logged)


async def test_the_server_speaks_first_with_session_created(parley: ServedApp) -> None:
    """The plugin sends its session.update as soon as it connects; OpenAI still opens with
    session.created, and a client may take the first event for the server's defaults."""
    async with realtime_session(parley) as recorder:
        async with asyncio.timeout(10):
            while not (recorder.of_type("session.updated") and recorder.of_type("session.created")):
                await asyncio.sleep(0.02)
    order = [e["type"] for e in recorder.server_events]
    assert order[:2] == ["session.created", "session.updated"], order


async def test_update_chat_ctx_adds_a_message_under_its_own_id(
    parley: ServedApp, warnings_logged: Records
) -> None:
    """update_chat_ctx sends conversation.item.create with the item's id and waits (5 s) for
    conversation.item.added with that same id."""
    async with realtime_session(parley) as recorder:
        context = recorder.session.chat_ctx.copy()
        message = context.add_message(role="user", content="My name is Ada.")
        await recorder.session.update_chat_ctx(context)
    added = recorder.of_type("conversation.item.added")
    assert [e["item"]["id"] for e in added] == [message.id]
    assert [m.id for m in recorder.session.chat_ctx.messages()] == [message.id]
    no_errors(recorder, warnings_logged)


@llm.function_tool
async def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: The city's name.
    """
    return f"It is sunny and 21 degrees in {city}."


@pytest.mark.slow
async def test_a_function_tool_is_called_and_its_result_spoken(
    parley: ServedApp, warnings_logged: Records
) -> None:
    async with realtime_session(parley) as recorder:
        session = recorder.session
        await session.update_instructions(INSTRUCTIONS)
        await session.update_tools([get_weather])
        question = session.chat_ctx.copy()
        question.add_message(role="user", content="What is the weather in Paris?")
        await session.update_chat_ctx(question)
        await session.generate_reply()
        call_reply = await first_reply(recorder, within_s=15)
        assert call_reply.calls, call_reply
        call = call_reply.calls[0]
        assert call.name == "get_weather"
        city = json.loads(call.arguments)["city"]
        output = session.chat_ctx.copy()
        output.items.append(
            llm.FunctionCallOutput(
                name=call.name,
                call_id=call.call_id,
                output=await get_weather(city),
                is_error=False,
            )
        )
        await session.update_chat_ctx(output)
        await session.generate_reply()
        async with asyncio.timeout(20):
            while len(recorder.replies) < 2:
                await asyncio.sleep(0.02)
        answer = await finished(recorder.replies[1], within_s=20)
    assert "paris" in city.lower()
    assert "sunny" in answer.text.lower() or "21" in answer.text, answer
    assert answer.audio_s > 0.5
    no_errors(recorder, warnings_logged)
