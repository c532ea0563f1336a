"""The frameworks' OpenAI speech services against Parley with only `base_url` (and the key)
changed: Pipecat's OpenAISTTService and OpenAITTSService, LiveKit's `openai.STT` and
`openai.TTS`, each with its defaults otherwise, through one real call."""

from __future__ import annotations

import asyncio
import warnings

import httpx
import numpy as np
import openai
import pytest
from livekit import rtc
from livekit.plugins import openai as livekit_openai

from loadtest.served import Served
from loadtest.speech import silence, speak

from .conftest import KEY, SAID, SPOKEN, SPOKEN_WORDS, heard, spoken_wav

AUDIOOP = "'audioop' is deprecated"
with warnings.catch_warnings():
    # pipecat.audio.utils imports the stdlib's audioop (deprecated since Python 3.11), and
    # pipecat's tts_service defines a deprecated class of its own at import
    warnings.filterwarnings("ignore", AUDIOOP, DeprecationWarning)
    warnings.filterwarnings("ignore", "`AudioContextTTSService` is deprecated", DeprecationWarning)
    from pipecat.frames.frames import (
        ErrorFrame,
        Frame,
        TranscriptionFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
        TTSStoppedFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.stt import OpenAISTTService
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.workers.runner import WorkerRunner

pytestmark = pytest.mark.filterwarnings(f"ignore:{AUDIOOP}:DeprecationWarning")


async def test_pipecat_stt(server: Served) -> None:
    """The service's own call, as its segmenting base makes it once a turn has ended."""
    async with httpx.AsyncClient() as http:  # the test's: Pipecat never closes its own
        stt = OpenAISTTService(api_key=KEY, base_url=f"{server.http_url}/v1", http_client=http)
        frames = [frame async for frame in stt.run_stt(spoken_wav())]
    assert not [f for f in frames if isinstance(f, ErrorFrame)], frames
    (said,) = [f for f in frames if isinstance(f, TranscriptionFrame)]
    assert heard(said.text, SPOKEN_WORDS), said.text


class Recorder(FrameProcessor):
    """Every frame the service sends on, kept (a transport's output would play them)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.stopped = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        if isinstance(frame, TTSStoppedFrame | ErrorFrame):
            self.stopped.set()
        await self.push_frame(frame, direction)


async def test_pipecat_tts(server: Served) -> None:
    """The service in a pipeline at OpenAI's 24 kHz, asked to speak a sentence."""
    recorder = Recorder()
    async with httpx.AsyncClient() as http:  # the test's: Pipecat never closes its own
        tts = OpenAITTSService(api_key=KEY, base_url=f"{server.http_url}/v1", http_client=http)
        worker = PipelineWorker(
            Pipeline([tts, recorder]), params=PipelineParams(audio_out_sample_rate=24_000)
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(runner.run())
            try:
                await worker.queue_frame(TTSSpeakFrame(SAID))
                async with asyncio.timeout(30):
                    await recorder.stopped.wait()
            finally:
                await worker.cancel()
    frames = recorder.frames
    assert not [f for f in frames if isinstance(f, ErrorFrame)], frames
    audio = b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))
    assert 1.5 < len(audio) / 2 / 24_000 < 6  # OpenAI's 24 kHz PCM16, as Pipecat reads it


async def test_livekit_stt(server: Served) -> None:
    rate = 24_000
    pcm = np.concatenate([silence(300, rate), speak(SPOKEN, rate), silence(500, rate)])
    frame = rtc.AudioFrame(pcm.astype("<i2").tobytes(), rate, 1, len(pcm))
    # LiveKit's STT never closes the client it makes (its aclose() closes only its realtime
    # pool): the test's own, made as LiveKit makes it, is closed here
    async with openai.AsyncClient(
        api_key=KEY, base_url=f"{server.http_url}/v1", max_retries=0
    ) as client:
        stt = livekit_openai.STT(api_key=KEY, base_url=f"{server.http_url}/v1", client=client)
        try:
            event = await stt.recognize([frame])
        finally:
            await stt.aclose()
    text = event.alternatives[0].text
    assert heard(text, SPOKEN_WORDS), text


async def test_livekit_tts(server: Served) -> None:
    tts = livekit_openai.TTS(api_key=KEY, base_url=f"{server.http_url}/v1")
    try:
        async with tts.synthesize(SAID) as stream:
            frames = [event.frame async for event in stream]
    finally:
        await tts.aclose()
    samples = sum(f.samples_per_channel for f in frames)
    assert frames and frames[0].sample_rate == 24_000
    assert 1.5 < samples / 24_000 < 6
