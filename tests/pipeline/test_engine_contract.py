"""The engine contract, checked on every engine we have (the fake included).

Each engine streams chunks that end with one End; closing the stream early, cancelling
the task reading it, or abort() all leave the engine holding nothing for the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from pipeline.engine_pipeline import EnginePipeline
from pipeline.engines.echo import EchoEngine
from pipeline.engines.subgraph import SubgraphEngine
from pipeline.types import (
    AudioChunk,
    Chunk,
    End,
    EntryEngine,
    ErrorChunk,
    PipelineRequest,
    TextDelta,
)
from tests.fakes.fake_engine import FakeEngine

FAKE = "tests.fakes.fake_engine:FakeEngine"
ENGINES: dict[str, Callable[[], EntryEngine]] = {
    "fake": lambda: FakeEngine(audio_ms=1_000, realtime_factor=20),
    "echo": EchoEngine,
    "subgraph": lambda: SubgraphEngine(  # the fake inside a group of its own
        stages=[{"name": "model", "engine": FAKE, "engine_args": {"audio_ms": 1_000}}],
        outputs=["model"],
    ),
}


def request(rid: str = "resp_1") -> PipelineRequest:
    t = np.arange(16_000) / 16_000
    audio = (5000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    return PipelineRequest(request_id=rid, audio=audio, text="hello")


@pytest.fixture(params=sorted(ENGINES))
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[EntryEngine]:
    eng = ENGINES[request.param]()
    assert isinstance(eng, EntryEngine)
    await eng.start()
    yield eng
    await eng.close()


async def test_streams_text_and_audio_then_one_end(engine: EntryEngine) -> None:
    chunks: list[Chunk] = [c async for c in engine.generate("r1", request("r1"))]
    assert isinstance(chunks[-1], End)
    assert sum(isinstance(c, End | ErrorChunk) for c in chunks) == 1
    assert any(isinstance(c, TextDelta) and c.text for c in chunks)
    audio = [c for c in chunks if isinstance(c, AudioChunk)]
    assert audio and np.abs(np.concatenate([a.pcm for a in audio])).max() > 1000
    assert engine.active_requests() == 0


async def test_a_transcription_only_request_answers_nothing(engine: EntryEngine) -> None:
    """Only the words heard (an engine with no recogniser: none), then End: no answer."""
    asked = replace(request("r1"), text=None, transcribe_only=True)
    chunks: list[Chunk] = [c async for c in engine.generate("r1", asked)]
    assert isinstance(chunks[-1], End)
    heard = chunks[:-1]
    assert all(isinstance(c, TextDelta) and c.kind == "input_transcript" for c in heard)
    assert engine.active_requests() == 0


async def test_closing_the_stream_early_leaves_no_state(engine: EntryEngine) -> None:
    stream: Any = engine.generate("r2", request("r2"))
    await anext(stream)
    assert engine.active_requests() == 1
    await stream.aclose()
    assert engine.active_requests() == 0


async def test_cancelling_the_reader_leaves_no_state(engine: EntryEngine) -> None:
    async def read() -> None:
        async for _ in engine.generate("r3", request("r3")):
            await asyncio.sleep(0.01)

    task = asyncio.create_task(read())
    await asyncio.sleep(0.03)
    task.cancel()
    await asyncio.wait({task})
    assert engine.active_requests() == 0


async def test_abort_ends_the_stream(engine: EntryEngine) -> None:
    seen: list[Chunk] = []
    async for chunk in engine.generate("r4", request("r4")):
        seen.append(chunk)
        if isinstance(chunk, AudioChunk):
            await engine.abort("r4")
    assert engine.active_requests() == 0
    assert sum(isinstance(c, AudioChunk) for c in seen) <= 2


async def test_pipeline_of_one_engine_aborts_on_close_and_reports_errors() -> None:
    engine = FakeEngine(audio_ms=5_000)
    pipeline = EnginePipeline(engine)
    stream: Any = pipeline.generate(request("r5"))
    async for chunk in stream:
        if isinstance(chunk, AudioChunk):
            break
    await stream.aclose()
    assert pipeline.active_requests() == 0 and "r5" in engine.aborted

    class Broken(FakeEngine):
        async def generate(
            self, request_id: str, request: PipelineRequest
        ) -> AsyncGenerator[Chunk, None]:
            yield TextDelta(text="partial ")
            raise RuntimeError("kernel panic in the model")

    chunks = [c async for c in EnginePipeline(Broken()).generate(request("r6"))]
    assert isinstance(chunks[-1], ErrorChunk) and "kernel panic" in chunks[-1].message
