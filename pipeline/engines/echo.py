"""The echo engine: a diagnostic loopback that answers a turn with the user's own voice.

It needs no model, so it is what `parley serve --pipeline echo` runs to check the media
path end to end (microphone -> buffers -> turn detection -> response -> speaker) and to
measure transport latency with no model time in the way. A typed message is echoed as text.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import soxr

from ..requests import RequestTracker, TracksRequests
from ..types import (
    INPUT_SAMPLE_RATE,
    AudioChunk,
    Chunk,
    End,
    EntryEngine,
    PipelineRequest,
    TextDelta,
)

CHUNK_MS = 100


class EchoEngine(TracksRequests, EntryEngine):
    """Streams the turn audio back in 100 ms chunks, as fast as the consumer takes them."""

    name = "echo"

    def __init__(self) -> None:
        self._requests: RequestTracker[None] = RequestTracker()

    async def generate(
        self, request_id: str, request: PipelineRequest
    ) -> AsyncGenerator[Chunk, None]:
        with self._requests.track(request_id):
            if request.transcribe_only:  # no recogniser here
                yield End()
                return
            if request.text:
                yield TextDelta(text=request.text)
            seconds = len(request.audio) / INPUT_SAMPLE_RATE
            if len(request.audio):
                yield TextDelta(text=f"(echo of {seconds:.1f} s of audio)")
            if len(request.audio) and not request.output_text_only:
                rate = request.output_sample_rate
                pcm = soxr.resample(request.audio, INPUT_SAMPLE_RATE, rate).astype(np.int16)
                step = rate * CHUNK_MS // 1000
                for start in range(0, len(pcm), step):
                    if self._requests.aborted(request_id):
                        return
                    yield AudioChunk(pcm=pcm[start : start + step], sample_rate=rate)
                    await asyncio.sleep(0)
            yield End()
