"""Pipecat's GPT-Live service (`OpenAILiveLLMService`) with its defaults, only `base_url`
and `api_key` pointed at Parley's `/v1/live/sessions`, in a pipeline as Pipecat builds one
(a context aggregator pair around the service), against the embedded default pipeline."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

from tests.realtime.apps import ServedApp

from .conftest import INSTRUCTIONS, KEY, LOOP, QUESTION, push_in_real_time, spoken
from .test_pipecat import (
    AUDIOOP,
    RATE,
    WEATHER,
    get_weather,
    loguru_problems,
    no_errors,
    running,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", AUDIOOP, DeprecationWarning)
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (
        FunctionCallResultFrame,
        InputAudioRawFrame,
        LLMRunFrame,
        SpeechOutputAudioRawFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.services.openai.live.llm import OpenAILiveLLMService, ResponsesDelegation
    from pipecat.services.openai.responses.llm import OpenAIResponsesLLMSettings

pytestmark = [LOOP, pytest.mark.filterwarnings(f"ignore:{AUDIOOP}:DeprecationWarning")]


def is_silence(frame: Any) -> bool:
    """The silence GPT-Live streams between answers (its output never pauses)."""
    return isinstance(frame, SpeechOutputAudioRawFrame) and len(set(frame.audio)) <= 1


def spoken_audio(recorder: Any) -> list[SpeechOutputAudioRawFrame]:
    return [f for f in recorder.of(SpeechOutputAudioRawFrame) if not is_silence(f)]


def not_silence(recorder: Any) -> list[Any]:
    return [f for f in recorder.frames if not is_silence(f)]


async def until_quiet(recorder: Any) -> None:
    """Until the answer is over: nothing new but the silence streamed between answers for
    longer than the pause after which Pipecat ends the assistant's turn."""
    async with asyncio.timeout(30):
        seen = -1
        while seen != len(said := not_silence(recorder)):
            seen = len(said)
            await asyncio.sleep(1.5)


def live_service(
    parley: ServedApp, delegation: ResponsesDelegation | None = None
) -> OpenAILiveLLMService:
    return OpenAILiveLLMService(
        api_key=KEY,
        base_url=f"{parley.ws_url}/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(system_instruction=INSTRUCTIONS),
        delegation=delegation,
    )


@pytest.mark.slow
async def test_pipecat_live_hears_a_spoken_question_and_plays_the_answer(
    parley: ServedApp,
) -> None:
    context = LLMContext()
    with loguru_problems() as logged:
        async with running(parley, context, live_service(parley)) as (task, recorder):

            async def push(data: bytes) -> None:
                await task.queue_frame(InputAudioRawFrame(data, RATE, 1))

            await task.queue_frame(LLMRunFrame())  # the session starts (Pipecat's examples)

            await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
            async with asyncio.timeout(30):
                # the answer as a speech stream, as GPT-Live's is (not TTS frames)
                while sum(len(f.audio) for f in spoken_audio(recorder)) < RATE:
                    await asyncio.sleep(0.05)  # half a second of the answer heard
                while not recorder.of(TTSTextFrame):
                    await asyncio.sleep(0.05)
            await recorder.wait_for(TTSStoppedFrame)
            await until_quiet(recorder)
    assert recorder.said().strip()
    no_errors(recorder, logged)


@pytest.mark.slow
async def test_pipecat_live_runs_a_delegated_function_and_the_answer_uses_it(
    parley: ServedApp,
) -> None:
    """Responses delegation as Pipecat sets it up: the context's tools go to the backend
    (Parley's own model), Pipecat runs the function it calls with the handler registered,
    sends the output and `response.create`, and the spoken answer carries the result."""
    context = LLMContext(tools=ToolsSchema(standard_tools=[WEATHER]))
    delegation = ResponsesDelegation(settings=OpenAIResponsesLLMSettings(model="parley"))
    service = live_service(parley, delegation)
    service.register_function("get_weather", get_weather)
    with loguru_problems() as logged:
        async with running(parley, context, service) as (task, recorder):

            async def push(data: bytes) -> None:
                await task.queue_frame(InputAudioRawFrame(data, RATE, 1))

            await task.queue_frame(LLMRunFrame())
            await push_in_real_time(push, spoken("What is the weather in Paris?", RATE), RATE)
            await recorder.wait_for(FunctionCallResultFrame, within_s=30)
            async with asyncio.timeout(30):
                while not any(w in recorder.said().lower() for w in ("sunny", "21")):
                    await asyncio.sleep(0.1)
            await until_quiet(recorder)
    result = recorder.of(FunctionCallResultFrame)[0]
    assert result.function_name == "get_weather"
    assert "paris" in str(result.arguments).lower()
    no_errors(recorder, logged)
