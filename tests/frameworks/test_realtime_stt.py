"""The frameworks' realtime speech-to-text services against Parley's transcription sessions
(`/v1/realtime?intent=transcription`), each with its defaults and only the base URL (and
key) changed: Pipecat's `OpenAIRealtimeSTTService` (no server VAD by default: it commits
when its VAD says the user stopped) and LiveKit's `openai.STT(use_realtime=True)` (server
VAD). One spoken question each, through the embedded cascade's Whisper."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import stt as lk_stt
from livekit.agents.utils import http_context
from livekit.plugins import openai

from tests.realtime.apps import ServedApp

from .conftest import KEY, LOOP, QUESTION, Records, push_in_real_time, spoken
from .test_pipecat import AUDIOOP, RATE, Recorder, loguru_problems, no_errors

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", AUDIOOP, DeprecationWarning)
    from pipecat.frames.frames import (
        InputAudioRawFrame,
        TranscriptionFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.services.openai.stt import OpenAIRealtimeSTTService
    from pipecat.workers.runner import WorkerRunner

pytestmark = [
    LOOP,
    pytest.mark.slow,
    pytest.mark.filterwarnings(f"ignore:{AUDIOOP}:DeprecationWarning"),
]


def heard_the_question(text: str) -> bool:
    return "capital" in text.lower() and "france" in text.lower()


async def test_pipecat_realtime_stt_transcribes_a_spoken_question(parley: ServedApp) -> None:
    service = OpenAIRealtimeSTTService(api_key=KEY, base_url=f"{parley.ws_url}/v1/realtime")
    recorder = Recorder()
    task = PipelineWorker(
        Pipeline([service, recorder]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    with loguru_problems() as logged:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(runner.run())
            try:

                async def push(data: bytes) -> None:
                    await task.queue_frame(InputAudioRawFrame(data, RATE, 1))

                await task.queue_frame(VADUserStartedSpeakingFrame())
                await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
                await task.queue_frame(VADUserStoppedSpeakingFrame())  # Pipecat's VAD would
                await recorder.wait_for(TranscriptionFrame)
            finally:
                await task.cancel()
    transcripts = [f.text for f in recorder.of(TranscriptionFrame)]
    assert len(transcripts) == 1 and heard_the_question(transcripts[0]), transcripts
    no_errors(recorder, logged)


async def test_livekit_realtime_stt_transcribes_a_spoken_question(
    parley: ServedApp, warnings_logged: Records
) -> None:
    events: list[lk_stt.SpeechEvent] = []
    async with http_context.open():
        stt = openai.STT(use_realtime=True, base_url=f"{parley.http_url}/v1", api_key=KEY)
        stream = stt.stream()

        async def read() -> None:
            async for event in stream:
                events.append(event)
                if event.type is lk_stt.SpeechEventType.FINAL_TRANSCRIPT:
                    return

        try:
            async with asyncio.TaskGroup() as tasks:
                reader = tasks.create_task(read())

                async def push(data: bytes) -> None:
                    stream.push_frame(rtc.AudioFrame(data, RATE, 1, len(data) // 2))

                await push_in_real_time(push, spoken(QUESTION, RATE), RATE)
                async with asyncio.timeout(30):
                    await reader
        finally:
            await stream.aclose()
            await stt.aclose()
    finals = [e for e in events if e.type is lk_stt.SpeechEventType.FINAL_TRANSCRIPT]
    assert finals and heard_the_question(finals[0].alternatives[0].text), events
    kinds: set[Any] = {e.type for e in events}
    assert lk_stt.SpeechEventType.START_OF_SPEECH in kinds  # the server's VAD
    assert not warnings_logged.lines("livekit"), warnings_logged.lines()
