"""Pipecat drives Parley with its defaults: OpenAIRealtimeLLMService with only `base_url` and
`api_key` pointed at Parley, in a pipeline as Pipecat's own realtime examples build it (a
context aggregator pair around the service), fed microphone frames by a source processor in
place of a transport. Pipecat treats every `error` event as fatal (it ends its receive
loop), and a server event its models cannot parse raises in that loop, logged by loguru."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from loguru import logger

from tests.realtime.apps import ServedApp

from .conftest import (
    INSTRUCTIONS,
    KEY,
    LOOP,
    QUESTION,
    live_instructions,
    push_in_real_time,
    spoken,
)

if TYPE_CHECKING:
    from loguru import Record  # only in loguru's type stubs

AUDIOOP = "'audioop' is deprecated"
with warnings.catch_warnings():
    # pipecat.audio.utils imports the stdlib's audioop (deprecated since Python 3.11)
    warnings.filterwarnings("ignore", AUDIOOP, DeprecationWarning)
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (
        ErrorFrame,
        Frame,
        FunctionCallResultFrame,
        InputAudioRawFrame,
        LLMRunFrame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.llm_service import FunctionCallParams, LLMService
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.workers.runner import WorkerRunner

pytestmark = [LOOP, pytest.mark.filterwarnings(f"ignore:{AUDIOOP}:DeprecationWarning")]

RATE = 24_000


class Recorder(FrameProcessor):
    """Every frame the service sends on, kept (a transport's output would play them)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        await self.push_frame(frame, direction)

    def of(self, kind: type[Any]) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)]

    def said(self) -> str:
        return "".join(f.text for f in self.of(TTSTextFrame))

    async def wait_for(self, kind: type[Any], count: int = 1, within_s: float = 30.0) -> None:
        async with asyncio.timeout(within_s):
            while len(self.of(kind)) < count:
                await asyncio.sleep(0.02)


@contextlib.contextmanager
def loguru_problems() -> Iterator[list[str]]:
    """Warnings and errors Pipecat logs (through loguru, not the logging module), and the
    `error` events it lets pass at debug level (conversation_already_has_active_response,
    response_cancel_not_active: its receive loop logs their message and goes on)."""
    lines: list[str] = []

    def problem(record: Record) -> bool:
        passed_over = record["function"] == "_receive_task_handler"
        return record["level"].no >= logger.level("WARNING").no or passed_over

    sink = logger.add(lambda message: lines.append(str(message)), level="DEBUG", filter=problem)
    try:
        yield lines
    finally:
        logger.remove(sink)


@contextlib.asynccontextmanager
async def running(
    parley: ServedApp, context: LLMContext, llm: LLMService[Any] | None = None
) -> AsyncIterator[tuple[PipelineWorker, Recorder]]:
    """The pipeline around `llm` (by default the Realtime service pointed at Parley)."""
    service = llm or realtime_service(parley)
    user, assistant = LLMContextAggregatorPair(context)
    recorder = Recorder()
    task = PipelineWorker(
        Pipeline([user, service, recorder, assistant]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(runner.run())
        try:
            yield task, recorder
        finally:
            await task.cancel()


def realtime_service(parley: ServedApp) -> OpenAIRealtimeLLMService:
    """The service with its defaults, pointed at Parley, with the agent's instructions
    (Pipecat's place for them since 1.9: a system message in the context is deprecated)."""
    return OpenAIRealtimeLLMService(
        api_key=KEY,
        base_url=f"{parley.ws_url}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(system_instruction=INSTRUCTIONS),
    )


def no_errors(recorder: Recorder, logged: list[str]) -> None:
    assert not recorder.of(ErrorFrame), recorder.of(ErrorFrame)
    assert not logged, logged


@pytest.mark.slow
async def test_a_spoken_question_is_answered_with_audio_and_transcripts(
    parley: ServedApp,
) -> None:
    context = LLMContext()
    with loguru_problems() as logged:
        async with running(parley, context) as (task, recorder):

            async def push(data: bytes) -> None:
                await task.queue_frame(InputAudioRawFrame(data, RATE, 1))

            await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
            assert live_instructions(parley) == [INSTRUCTIONS]
            await recorder.wait_for(TTSStoppedFrame)
            await asyncio.sleep(0.5)  # the assistant aggregator writes the answer down
    history = [m for m in context.get_messages() if isinstance(m, dict)]
    user = " ".join(str(m.get("content")) for m in history if m["role"] == "user").lower()
    assert any(word in user for word in ("capital", "france")), history
    assert [m for m in history if m["role"] == "assistant"], history
    assert recorder.said().strip()
    assert sum(len(f.audio) for f in recorder.of(TTSAudioRawFrame)) > RATE  # > 0.5 s
    no_errors(recorder, logged)


@pytest.mark.slow
async def test_a_greeting_is_spoken_on_the_first_run(parley: ServedApp) -> None:
    context = LLMContext(
        [
            {"role": "user", "content": "Greet the user and offer your help."},
        ]
    )
    with loguru_problems() as logged:
        async with running(parley, context) as (task, recorder):
            await task.queue_frame(LLMRunFrame())
            await recorder.wait_for(TTSStoppedFrame)
    assert recorder.said().strip()
    assert recorder.of(TTSAudioRawFrame)
    no_errors(recorder, logged)


async def get_weather(params: FunctionCallParams) -> None:
    city = params.arguments["city"]
    await params.result_callback({"city": city, "weather": "sunny", "celsius": 21})


WEATHER = FunctionSchema(
    name="get_weather",
    description="The current weather in a city.",
    properties={"city": {"type": "string", "description": "The city's name."}},
    required=["city"],
)


@pytest.mark.slow
async def test_a_function_tool_is_called_and_its_result_spoken(parley: ServedApp) -> None:
    context = LLMContext(
        [
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        tools=ToolsSchema(standard_tools=[WEATHER]),
    )
    service = realtime_service(parley)
    service.register_function("get_weather", get_weather)
    with loguru_problems() as logged:
        async with running(parley, context, service) as (task, recorder):
            await task.queue_frame(LLMRunFrame())
            await recorder.wait_for(FunctionCallResultFrame, within_s=15)
            await recorder.wait_for(TTSStoppedFrame, within_s=20)
    result = recorder.of(FunctionCallResultFrame)[0]
    assert result.function_name == "get_weather"
    assert "paris" in str(result.arguments).lower()
    said = recorder.said().lower()
    assert "sunny" in said or "21" in said, said
    no_errors(recorder, logged)
