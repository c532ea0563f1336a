"""Pipecat's GPT-Live service (`OpenAILiveLLMService`) with its defaults, only `base_url`
and `api_key` pointed at Parley's `/v1/live/sessions`, in a pipeline as Pipecat builds one
(a context aggregator pair around the service), against the embedded default pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator

import pytest

from tests.realtime.apps import ServedApp

from .conftest import INSTRUCTIONS, KEY, QUESTION, push_in_real_time, spoken
from .test_pipecat import AUDIOOP, RATE, Recorder, loguru_problems, no_errors

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", AUDIOOP, DeprecationWarning)
    from pipecat.frames.frames import (
        InputAudioRawFrame,
        LLMRunFrame,
        SpeechOutputAudioRawFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.services.openai.live.llm import OpenAILiveLLMService
    from pipecat.workers.runner import WorkerRunner

pytestmark = pytest.mark.filterwarnings(f"ignore:{AUDIOOP}:DeprecationWarning")


@contextlib.asynccontextmanager
async def running(
    parley: ServedApp, context: LLMContext
) -> AsyncIterator[tuple[PipelineWorker, Recorder]]:
    service = OpenAILiveLLMService(
        api_key=KEY,
        base_url=f"{parley.ws_url}/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(system_instruction=INSTRUCTIONS),
    )
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


@pytest.mark.slow
async def test_pipecat_live_hears_a_spoken_question_and_plays_the_answer(
    parley: ServedApp,
) -> None:
    context = LLMContext()
    with loguru_problems() as logged:
        async with running(parley, context) as (task, recorder):

            async def push(data: bytes) -> None:
                await task.queue_frame(InputAudioRawFrame(data, RATE, 1))

            await task.queue_frame(LLMRunFrame())  # the session starts (Pipecat's examples)

            await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
            async with asyncio.timeout(30):
                # the answer as a speech stream, as GPT-Live's is (not TTS frames)
                while sum(len(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame)) < RATE:
                    await asyncio.sleep(0.05)  # half a second of the answer heard
                while not recorder.of(TTSTextFrame):
                    await asyncio.sleep(0.05)
            # Pipecat ends the assistant's turn after a pause in its transcript: leave once
            # the answer is over (nothing new for longer than that pause)
            await recorder.wait_for(TTSStoppedFrame)
            async with asyncio.timeout(30):
                seen = -1
                while seen != len(recorder.frames):
                    seen = len(recorder.frames)
                    await asyncio.sleep(1.5)
    assert recorder.said().strip()
    no_errors(recorder, logged)
