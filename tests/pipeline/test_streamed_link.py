"""A turn streamed while the user speaks reaches its entry stage through the graph, in this
process or across a worker's link, before the turn's request; a restarted worker has no
turns, and its request is taken whole; a graph whose entry stage cannot stream says so."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import numpy as np
import pytest

from pipeline.engine_pipeline import EnginePipeline
from pipeline.engines.echo import EchoEngine
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import End, PipelineRequest, TextDelta, pipeline_streams_turns, streams_input
from pipeline.worker import WorkerEngine
from tests.fakes.stage_engines import StreamedEntry


def graph_text(placement: str) -> str:
    return f"""\
name: streamed
stages:
  - name: thinker
    engine: "tests.fakes.stage_engines:StreamedEntry"
    placement: {{process: {placement}}}
outputs: [thinker]
"""


@pytest.fixture(params=["main", "worker"])
async def graph(request: pytest.FixtureRequest) -> AsyncIterator[StageGraph]:
    config = parse_graph(graph_text(request.param))
    g = StageGraph(config, build_engines(config))
    await g.start()
    try:
        yield g
    finally:
        await g.close()


def context(session: str, turn: str = "") -> PipelineRequest:
    audio = np.ones(3200, dtype=np.int16) if turn else np.zeros(0, dtype=np.int16)
    return PipelineRequest(request_id="r", audio=audio, session_id=session, streamed_turn=turn)


async def answer(graph: StageGraph, request: PipelineRequest) -> str:
    out = [c async for c in graph.generate(request)]
    assert isinstance(out[-1], End)
    return "".join(c.text for c in out if isinstance(c, TextDelta))


async def test_the_calls_reach_the_entry_stage_before_the_turns_request(
    graph: StageGraph,
) -> None:
    assert pipeline_streams_turns(graph)
    assert await graph.open_turn("t1", context("s1"))
    for _ in range(4):
        assert await graph.feed_turn("t1", np.ones(800, dtype=np.int16))
    said = await answer(graph, context("s1", "t1"))
    assert said.startswith("prefilled s1 3200 ")
    await graph.open_turn("t2", context("s1"))
    assert await graph.drop_turn("t2")
    assert (await answer(graph, context("s1", "t2"))).startswith("missing ")
    assert (await answer(graph, context("s1"))).startswith("whole ")
    thinker = graph.engines["thinker"]
    if isinstance(thinker, WorkerEngine):  # the worker's counts come with its heartbeat
        async with asyncio.timeout(5):
            while thinker.streamed_turns().get("missing") != 1:
                await asyncio.sleep(0.05)
    assert isinstance(thinker, StreamedEntry | WorkerEngine)
    assert thinker.streamed_turns() == {"prefilled": 1, "missing": 1}


async def test_a_restarted_worker_takes_the_turn_whole() -> None:
    config = parse_graph(graph_text("worker"))
    graph = StageGraph(config, build_engines(config))
    await graph.start()
    try:
        thinker = graph.engines["thinker"]
        assert isinstance(thinker, WorkerEngine) and thinker.pid is not None
        old_pid = thinker.pid
        await graph.open_turn("t1", context("s1"))
        await graph.feed_turn("t1", np.ones(800, dtype=np.int16))
        os.kill(old_pid, signal.SIGKILL)
        async with asyncio.timeout(20):
            while thinker.pid in (None, old_pid) or not graph.streams_turns():
                await asyncio.sleep(0.05)
        said = await answer(graph, context("s1", "t1"))
        assert said == f"missing {thinker.pid}"  # the fresh worker never had it
    finally:
        await graph.close()


async def test_a_pipeline_without_the_capability_says_so() -> None:
    echo = EnginePipeline(EchoEngine())
    assert not streams_input(echo.engine) and not pipeline_streams_turns(echo)
    assert not await echo.open_turn("t1", context("s1"))
    assert not await echo.feed_turn("t1", np.ones(800, dtype=np.int16))
    assert not await echo.drop_turn("t1")
