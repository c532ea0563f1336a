"""A spoken turn through a session is streamed to the tiny Qwen3-Omni Thinker while the user
speaks (the graph in this process), and answered as the same turn taken whole; a turn the
user clears, or whose session ends, mid-speech is dropped; manual turns, and a pipeline that
cannot stream, go as before."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from loadtest.speech import silence, speak, trim_silence
from pipeline.engine_pipeline import EnginePipeline
from pipeline.engines.qwen3_omni.thinker import ThinkerEngine
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import OutputChunk, PipelineRequest, TextDelta
from sessions.events import ResponseDone
from sessions.manager import SessionManager
from sessions.session import Session
from sessions.turn_taking import ServerTurnTaking
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.sink import ClockedSink

GRAPH = """\
name: thinker_only
stages:
  - name: thinker
    engine: qwen3_omni.thinker
    engine_args: {tiny: true, threads: 1, max_new_tokens: 4, min_new_tokens: 4,
                  session_kv_tokens: 8192, max_context: 1024}
outputs: [thinker]
"""


class RecordedGraph(StageGraph):
    """The graph, noting each request and the text of its answer."""

    requests: list[PipelineRequest]
    said: dict[str, str]

    async def generate(self, request: PipelineRequest) -> AsyncGenerator[OutputChunk, None]:
        self.requests.append(request)
        self.said[request.request_id] = ""
        async for chunk in super().generate(request):
            if isinstance(chunk, TextDelta) and chunk.kind == "output":
                self.said[request.request_id] += chunk.text
            yield chunk


@pytest.fixture
async def graph() -> AsyncIterator[RecordedGraph]:
    config = parse_graph(GRAPH)
    g = RecordedGraph(config, build_engines(config))
    g.requests, g.said = [], {}
    await g.start()
    streamed = thinker(g).streamed
    assert streamed is not None
    streamed.staging.gather_s = 0.01  # the test's audio comes at once, not in seconds
    try:
        yield g
    finally:
        await g.close()


def thinker(graph: StageGraph) -> ThinkerEngine:
    engine = graph.engines["thinker"]
    assert isinstance(engine, ThinkerEngine)
    return engine


@pytest.fixture
async def manager(redis: aioredis.Redis, graph: RecordedGraph) -> AsyncIterator[SessionManager]:
    async with SessionManager(redis, graph, max_sessions=4) as m:
        yield m


async def open_session(
    manager: SessionManager, config: dict[str, Any] | None = None
) -> tuple[Session, ClockedSink]:
    sink = await ClockedSink(clock=manager.clock).__aenter__()
    session = await manager.create(sink, config)
    await sink.wait_for(lambda e: e.type == "session.created")
    return session, sink


def utterance() -> np.ndarray:
    return np.concatenate([silence(300), trim_silence(speak("Tell me something.")), silence(50)])


async def feed(session: Session, pcm: np.ndarray) -> None:
    for start in range(0, len(pcm), 320):  # 20 ms at a time, as fast as it goes
        await session.append_audio(pcm[start : start + 320].tobytes())
        await asyncio.sleep(0)


def stream_of(session: Session) -> Any:
    assert isinstance(session.turn_taking, ServerTurnTaking)
    assert session.turn_taking.stream is not None
    return session.turn_taking.stream


async def test_a_spoken_turn_is_prefilled_as_it_comes_and_answered_as_the_whole_turn(
    manager: SessionManager, graph: RecordedGraph
) -> None:
    session, sink = await open_session(manager)
    try:
        await feed(session, np.concatenate([utterance(), silence(900)]))
        done = await sink.wait_for(lambda e: isinstance(e, ResponseDone), timeout=60)
        assert isinstance(done, ResponseDone) and done.status == "completed"
        (request,) = [r for r in graph.requests if not r.transcribe_only]
        assert request.streamed_turn and len(request.audio) > 16_000
        assert thinker(graph).streamed_turns()["prefilled"] == 1
        assert stream_of(session).opened == stream_of(session).named == 1
        # the same turn taken whole, in a session of its own: the same words
        whole = dataclasses.replace(request, request_id="whole", session_id="w", streamed_turn="")
        async for _ in graph.generate(whole):
            pass
        assert graph.said[request.request_id] == graph.said["whole"] != ""
    finally:
        await session.close()
        await sink.__aexit__(None, None, None)


async def test_a_turn_cleared_or_ended_mid_speech_is_dropped(
    manager: SessionManager, graph: RecordedGraph
) -> None:
    engine = thinker(graph)
    assert engine.streamed is not None
    sessions = [await open_session(manager) for _ in range(2)]
    try:
        half = utterance()[: 16_000 * 3 // 4 + 4800]  # the speech begun, not ended
        for session, _ in sessions:
            await feed(session, half)
        async with asyncio.timeout(10):
            while len(engine.streamed) < 2:  # both turns open in the engine
                await asyncio.sleep(0.01)
        await sessions[0][0].clear_audio()
        async with asyncio.timeout(10):
            while len(engine.streamed) > 1:
                await asyncio.sleep(0.01)
        await sessions[1][0].close()  # the session's end: the engine forgets its turn
        assert len(engine.streamed) == 0
        assert not [r for r in graph.requests if not r.transcribe_only]  # nothing answered
        assert engine.streamed_turns()["prefilled"] == 0
    finally:
        for session, sink in sessions:
            await session.close()
            await sink.__aexit__(None, None, None)


async def test_manual_turns_are_not_streamed(manager: SessionManager, graph: RecordedGraph) -> None:
    session, sink = await open_session(manager, {"turn_detection": None})
    try:
        await feed(session, utterance())
        await session.commit_audio()
        await session.create_response()
        await sink.wait_for(lambda e: isinstance(e, ResponseDone), timeout=60)
        (request,) = [r for r in graph.requests if not r.transcribe_only]
        assert request.streamed_turn == "" and stream_of(session).opened == 0
        assert thinker(graph).streamed_turns()["prefilled"] == 0
    finally:
        await session.close()
        await sink.__aexit__(None, None, None)


async def test_a_pipeline_that_cannot_stream_is_never_asked(redis: aioredis.Redis) -> None:
    engine = FakeEngine()
    async with SessionManager(redis, EnginePipeline(engine), max_sessions=2) as manager:
        session, sink = await open_session(manager)
        try:
            await feed(session, np.concatenate([utterance(), silence(900)]))
            await sink.wait_for(lambda e: isinstance(e, ResponseDone), timeout=30)
            assert stream_of(session).opened == 0
            assert all(r.streamed_turn == "" for r in engine.requests)
        finally:
            await session.close()
            await sink.__aexit__(None, None, None)
