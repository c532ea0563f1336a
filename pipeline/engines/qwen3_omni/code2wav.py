"""The `qwen3_omni.code2wav` engine: codec frames in, PCM16 at the request's rate out.

Frames are decoded in chunks with left context (`code2wav_runner.FrameChunker`): a small
first chunk for an early first sound, then `chunk` frames with `left_context` frames before
them. The chunks that concurrent requests have ready at the same time decode as one batch;
when more are ready than a batch takes, the requests nearest to running out of audio go
first (`Playback`). A request is a member of the batch (`StepBatcher.member`) while it has
frames to decode, and away while it waits for the Talker's next ones.
Code2Wav speaks at 24 kHz; another output rate is resampled with soxr.

`normalize_peak` scales each chunk to that peak: random weights make a signal of about
1e-6 that PCM16 rounds to silence, so the tiny graph sets it to make its noise audible.
A real model's output is left as it is (the default).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr

from ...types import AudioChunk, Chunk, CodecCodes, End, ErrorChunk, StageInput, StreamEngine
from .code2wav_runner import SAMPLE_RATE, Code2WavRunner, Codes, FrameChunker, window_lengths
from .playback import Clock, Playback
from .stage import ModelStage
from .step_batcher import StepBatcher

Window = tuple[Codes, int, int]
"""One request's share of a batched decode: frames, context frames, output rate."""


class Code2WavEngine(ModelStage[FrameChunker], StreamEngine):
    name = "qwen3_omni.code2wav"
    part = "code2wav"

    def __init__(
        self,
        *,
        first_chunk: int = 5,
        chunk: int = 25,
        left_context: int = 25,
        normalize_peak: float | None = None,
        clock: Clock = time.monotonic,
        **model: Any,
    ) -> None:
        super().__init__(**model)
        FrameChunker(first_chunk=first_chunk, chunk=chunk, left_context=left_context)  # checks
        self.first_chunk = first_chunk
        self.chunk = chunk
        self.left_context = left_context
        self.normalize_peak = normalize_peak
        self.clock = clock
        """The playback clock that decodes are scheduled by (tests pass their own)."""
        self.runner: Code2WavRunner | None = None

    def _loaded(self) -> None:
        assert self.model is not None
        runner = Code2WavRunner(
            self.model,
            max_batch=self.max_batch,
            lengths=window_lengths(self.first_chunk, self.chunk, self.left_context),
            capture=self.capture_graphs,
        )
        runner.warm()  # every shape captured before the stage is ready
        self.runner = runner

    def _batcher(self) -> StepBatcher[Window, npt.NDArray[np.int16]]:
        return StepBatcher(
            self.name, self.thread, self._render_batch, max_batch=self.max_batch, clock=self.clock
        )

    def _render_batch(self, windows: list[Window]) -> list[npt.NDArray[np.int16]]:
        """On the model thread: decode every request's window at once, then each to PCM16."""
        assert self.runner is not None
        decoded = self.runner.decode_batch([(frames, context) for frames, context, _ in windows])
        return [
            self._pcm(audio, rate) for audio, (_, _, rate) in zip(decoded, windows, strict=True)
        ]

    def _pcm(self, audio: npt.NDArray[np.float32], rate: int) -> npt.NDArray[np.int16]:
        """Scale, resample, PCM16."""
        if self.normalize_peak and len(audio):
            peak = float(np.abs(audio).max())
            if peak > 0:
                audio = audio * (self.normalize_peak / peak)
        if rate != SAMPLE_RATE:
            audio = soxr.resample(audio, SAMPLE_RATE, rate)
        return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)

    async def generate(self, request_id: str, inputs: StageInput, /) -> AsyncGenerator[Chunk, None]:
        batcher = self.batcher
        if self.runner is None or batcher is None:
            yield ErrorChunk(message="code2wav was not started", stage=self.name)
            return
        if inputs.request.output_text_only:
            yield End()
            return
        rate = inputs.request.output_sample_rate
        chunker = FrameChunker(
            first_chunk=self.first_chunk, chunk=self.chunk, left_context=self.left_context
        )
        self._requests.begin(request_id, chunker)
        playback = Playback(self.clock)  # from the request's arrival here
        chunks = aiter(inputs.chunks)

        async def render(window: tuple[Codes, int]) -> AudioChunk:
            pcm = await batcher.step((*window, rate), deadline=playback.deadline())
            playback.produced(len(pcm) / rate)
            return AudioChunk(pcm=pcm, sample_rate=rate)

        try:
            with batcher.member():
                while True:
                    with batcher.away():  # the batch need not wait while the Talker works
                        chunk = await anext(chunks, None)
                    if self._requests.aborted(request_id):
                        return  # aborted
                    if isinstance(chunk, ErrorChunk):
                        yield chunk
                        return
                    if chunk is None or isinstance(chunk, End):
                        break
                    if not isinstance(chunk, CodecCodes):
                        continue
                    for frame in chunk.codes.reshape(-1, chunk.codes.shape[-1]):
                        if (ready := chunker.push(frame)) is not None:
                            audio = await render(ready)
                            if self._requests.aborted(request_id):
                                return
                            yield audio
                if (rest := chunker.flush()) is not None:
                    audio = await render(rest)
                    if self._requests.aborted(request_id):
                        return
                    yield audio
            yield End()
        finally:
            self._requests.end(request_id)
