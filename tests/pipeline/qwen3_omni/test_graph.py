"""The tiny Qwen3-Omni through the stage graph: across worker processes, streamed, aborted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np
import pytest

from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import (
    AudioChunk,
    Chunk,
    CodecCodes,
    End,
    HiddenStates,
    OutputChunk,
    PipelineRequest,
    StageInput,
    StreamEngine,
    TextDelta,
)
from pipeline.worker import WorkerEngine

from .conftest import graph_yaml, turn_audio


class Recording(StreamEngine):
    """An engine in front of another that notes every chunk its upstream hands it."""

    def __init__(self, inner: StreamEngine) -> None:
        self.inner = inner
        self.name = inner.name
        self.received: list[Chunk] = []

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def active_requests(self) -> int:
        return self.inner.active_requests()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def _noted(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        async for chunk in chunks:
            self.received.append(chunk)
            yield chunk

    def generate(self, request_id: str, inputs: StageInput, /) -> AsyncGenerator[Chunk, None]:
        return self.inner.generate(
            request_id, StageInput(inputs.request, self._noted(inputs.chunks))
        )


async def start_graph(text: str) -> tuple[StageGraph, dict[str, Recording]]:
    """The graph, with what reaches the Talker and Code2Wav recorded on their way in."""
    config = parse_graph(text)
    engines = build_engines(config)
    recordings: dict[str, Recording] = {}
    for name in ("talker", "code2wav"):
        inner = engines[name]
        assert isinstance(inner, StreamEngine)
        recordings[name] = Recording(inner)
    graph = StageGraph(config, {**engines, **recordings})
    await graph.start()
    return graph, recordings


async def remote_requests(graph: StageGraph) -> int:
    engines = [e for e in graph.engines.values() if isinstance(e, WorkerEngine)]
    return sum([await e.remote_active_requests() for e in engines])


@pytest.mark.slow
async def test_workers_stream_hidden_states_and_codes_and_audio_comes_before_the_text_ends() -> (
    None
):
    # a long reply and a short first audio chunk: the Talker must start on the first tokens
    graph, recordings = await start_graph(
        graph_yaml(placement="worker", tokens=300, frames=8, first_chunk=2, chunk=3)
    )
    try:
        workers = [graph.engines["thinker"], recordings["talker"].inner]
        assert all(isinstance(e, WorkerEngine) for e in workers)
        request = PipelineRequest(request_id="w1", audio=turn_audio(1.0))
        out: list[OutputChunk] = []
        async with asyncio.timeout(45):
            async for chunk in graph.generate(request):
                out.append(chunk)
        assert isinstance(out[-1], End)
        text = [i for i, c in enumerate(out) if isinstance(c, TextDelta)]
        audio = [i for i, c in enumerate(out) if isinstance(c, AudioChunk)]
        assert len(text) == 300 and audio
        assert audio[0] < text[-1]  # the first sound came while the Thinker still spoke
        # hidden states left the Thinker's process as typed chunks (the prompt's, then one
        # per reply token fed) on their way to the Talker's, which read them until it was done
        hidden = [c for c in recordings["talker"].received if isinstance(c, HiddenStates)]
        parts = [h.metadata["part"] for h in hidden]
        assert parts[0] == "prompt" and len(parts) > 8 and set(parts[1:]) == {"reply"}
        assert all(h.array.shape[1:] == (2, 64) and h.array.dtype == np.float32 for h in hidden)
        # codes came back from the Talker's process, one 16-code frame each
        codes = [c for c in recordings["code2wav"].received if isinstance(c, CodecCodes)]
        assert len(codes) == 8
        assert all(c.codes.shape == (1, 16) and c.codes.dtype == np.int32 for c in codes)
        pcm = np.concatenate([out[i].pcm for i in audio])  # type: ignore[union-attr]
        assert np.abs(pcm).max() > 1000  # audible noise
        assert graph.active_requests() == 0
        assert await remote_requests(graph) == 0
    finally:
        await graph.close()


@pytest.fixture
async def in_process() -> AsyncIterator[StageGraph]:
    graph, _ = await start_graph(graph_yaml(tokens=40, frames=40, first_chunk=2, chunk=5))
    yield graph
    await graph.close()


@pytest.mark.parametrize(
    ("stop_after", "busy_stage"),
    [(TextDelta, "thinker"), (AudioChunk, "talker"), (AudioChunk, "code2wav")],
)
async def test_closing_the_stream_aborts_every_stage(
    in_process: StageGraph, stop_after: type, busy_stage: str
) -> None:
    request = PipelineRequest(request_id=f"a-{busy_stage}", audio=turn_audio(0.5))
    stream = in_process.generate(request)
    async with asyncio.timeout(30):
        async for chunk in stream:
            if isinstance(chunk, stop_after):
                break
    assert in_process.engines[busy_stage].active_requests() == 1
    await stream.aclose()
    assert in_process.active_requests() == 0
    for engine in in_process.engines.values():
        assert engine.active_requests() == 0
