"""The OpenAI Agents SDK (`openai-agents`) drives Parley with its defaults: a RealtimeAgent
run by a RealtimeRunner whose model config names only Parley's URL and key. Its defaults
(semantic_vad, whisper-style transcription, voice "ash", tracing "auto") must all be
accepted, and every server event must parse with the SDK's own types: it logs "Failed to
validate server event" for one that does not and drops it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from agents import function_tool
from agents.realtime import (
    RealtimeAgent,
    RealtimeModelConfig,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionEvent,
)
from agents.realtime.events import RealtimeRawModelEvent
from agents.realtime.model_events import RealtimeModelRawServerEvent
from agents.realtime.model_inputs import RealtimeModelSendRawMessage

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

RATE = 24_000  # the SDK's default input format: pcm16 at 24 kHz
Match = Callable[[RealtimeSessionEvent], bool]

pytestmark = LOOP


class Listener:
    """Reads a session's events in the background so the test can wait for one and still
    see everything before it."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.events: list[RealtimeSessionEvent] = []

    async def read(self) -> None:
        async for event in self.session:
            self.events.append(event)

    async def wait_for(self, match: Match, within_s: float = 30.0) -> RealtimeSessionEvent:
        seen = 0
        async with asyncio.timeout(within_s):
            while True:
                for event in self.events[seen:]:
                    if match(event):
                        return event
                seen = len(self.events)
                await asyncio.sleep(0.02)

    def raw(self, server_type: str) -> list[dict[str, Any]]:
        """The raw server events of `server_type` the model layer passed on."""
        return [e for e in self.server_events() if e.get("type") == server_type]

    def server_events(self) -> list[dict[str, Any]]:
        return [
            e.data.data
            for e in self.events
            if isinstance(e, RealtimeRawModelEvent)
            and isinstance(e.data, RealtimeModelRawServerEvent)
        ]

    async def wait_for_server(self, server_type: str, within_s: float = 30.0) -> dict[str, Any]:
        """The first raw server event of `server_type`."""
        async with asyncio.timeout(within_s):
            while not self.raw(server_type):
                await asyncio.sleep(0.02)
        return self.raw(server_type)[0]


@contextlib.asynccontextmanager
async def agent_session(parley: ServedApp, agent: RealtimeAgent) -> AsyncIterator[Listener]:
    config: RealtimeModelConfig = {"url": f"{parley.ws_url}/v1/realtime", "api_key": KEY}
    async with await RealtimeRunner(agent).run(model_config=config) as session:
        listener = Listener(session)
        async with asyncio.TaskGroup() as tasks:
            reader = tasks.create_task(listener.read())
            try:
                yield listener
            finally:
                reader.cancel()


def no_errors(listener: Listener, logged: Records) -> None:
    errors = [e for e in listener.events if e.type == "error"]
    assert not errors, errors
    assert not listener.raw("error"), listener.raw("error")
    assert not logged.lines("openai.agents"), logged.lines()  # "Failed to validate server event"


@pytest.mark.slow
async def test_a_spoken_question_is_answered_with_audio_and_transcripts(
    parley: ServedApp, warnings_logged: Records
) -> None:
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS)
    async with agent_session(parley, agent) as listener:
        await listener.wait_for_server("session.updated")
        assert live_instructions(parley) == [INSTRUCTIONS]
        await push_in_real_time(listener.session.send_audio, spoken(QUESTION, RATE), RATE)
        await listener.wait_for(lambda e: e.type == "audio_end")
        await listener.wait_for_server("response.done")
        await asyncio.sleep(0.5)  # the history's last transcript updates
    session = listener.raw("session.updated")[-1]["session"]
    assert session["instructions"] == INSTRUCTIONS
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert any(e.type == "audio" for e in listener.events)
    history = [e for e in listener.events if e.type == "history_updated"][-1].history
    user = [i for i in history if i.type == "message" and i.role == "user"]
    assistant = [i for i in history if i.type == "message" and i.role == "assistant"]
    assert user and assistant, history
    heard = " ".join(getattr(c, "transcript", None) or "" for c in user[-1].content).lower()
    assert any(word in heard for word in ("capital", "france")), heard
    said = " ".join(getattr(c, "transcript", None) or "" for c in assistant[-1].content)
    assert said.strip(), assistant[-1]
    no_errors(listener, warnings_logged)


@pytest.mark.slow
async def test_a_greeting_then_a_message_right_after_it(
    parley: ServedApp, warnings_logged: Records
) -> None:
    """A greeting by response.create with its own instructions (the SDK has no reply call:
    a raw client event is its way), then send_message (conversation.item.create, then
    response.create) as soon as the greeting is done, as a text chat on top of the voice
    session does."""
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS)
    async with agent_session(parley, agent) as listener:
        greeting = {
            "type": "response.create",
            "other_data": {"response": {"instructions": "Greet the user and offer your help."}},
        }
        await listener.session.model.send_event(
            RealtimeModelSendRawMessage(message=greeting)  # type: ignore[arg-type]
        )
        await listener.wait_for_server("response.done")
        await listener.session.send_message("What is the capital of France?")
        async with asyncio.timeout(20):
            while len(listener.raw("response.done")) < 2 and not listener.raw("error"):
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
    assert sum(e.type == "audio_end" for e in listener.events) == 2
    statuses = [e["response"]["status"] for e in listener.raw("response.done")]
    assert statuses == ["completed", "completed"], statuses
    no_errors(listener, warnings_logged)


@pytest.mark.slow
async def test_speaking_over_an_answer_interrupts_it(
    parley: ServedApp, warnings_logged: Records
) -> None:
    """The SDK's defaults on a barge-in: server VAD cancels the answer (interrupt_response),
    and the SDK truncates it to what its playback tracker says was played."""
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS)
    async with agent_session(parley, agent) as listener:
        await listener.session.send_message("Tell me a long story about a dragon.")
        await listener.wait_for(lambda e: e.type == "audio")
        await asyncio.sleep(1.0)
        await push_in_real_time(listener.session.send_audio, spoken(QUESTION, RATE), RATE)
        async with asyncio.timeout(20):
            while len(listener.raw("response.done")) < 2:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
    assert any(e.type == "audio_interrupted" for e in listener.events)
    statuses = [e["response"]["status"] for e in listener.raw("response.done")]
    assert statuses == ["cancelled", "completed"], statuses
    no_errors(listener, warnings_logged)
    ends = [e["audio_end_ms"] for e in listener.raw("conversation.item.truncated")]
    assert ends and ends[-1] == ends[0], ends  # the client's cut stands


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: The city's name.
    """
    return f"It is sunny and 21 degrees in {city}."


@pytest.mark.slow
async def test_a_function_tool_is_called_and_its_result_spoken(
    parley: ServedApp, warnings_logged: Records
) -> None:
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS, tools=[get_weather])
    async with agent_session(parley, agent) as listener:
        await listener.wait_for_server("session.updated")
        await listener.session.send_message("What is the weather in Paris?")
        end = await listener.wait_for(lambda e: e.type == "tool_end", within_s=15)
        async with asyncio.timeout(20):  # the call's response, then the answer's
            while len(listener.raw("response.done")) < 2:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
    assert end.type == "tool_end" and "Paris" in end.arguments
    history = [e for e in listener.events if e.type == "history_updated"][-1].history
    said = [
        getattr(c, "transcript", None) or ""
        for item in history
        if item.type == "message" and item.role == "assistant"
        for c in item.content
    ]
    assert any("sunny" in text.lower() or "21" in text for text in said), said
    no_errors(listener, warnings_logged)
