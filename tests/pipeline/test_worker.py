"""Stages in worker processes: same results, abort across the process, restart on death."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import numpy as np
import pytest

from loadtest.proc_cpu import cmdline, tree
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import AudioChunk, End, ErrorChunk, OutputChunk, PipelineRequest, TextDelta
from pipeline.worker import WorkerEngine, WorkerFailed
from pipeline.worker_main import WorkerSpec

SCRIPTED = "tests.fakes.stage_engines:ScriptedStage"
SCRIPTED_ENTRY = "tests.fakes.stage_engines:ScriptedEntry"
GRAPH = f"""\
name: workers
stages:
  - name: thinker
    engine: "{SCRIPTED_ENTRY}"
    engine_args: {{name: thinker, count: 40, delay_s: 0.005}}
    placement: {{process: worker}}
  - name: talker
    engine: "{SCRIPTED}"
    engine_args: {{name: talker}}
  - name: code2wav
    engine: "{SCRIPTED}"
    engine_args: {{name: code2wav, emit: audio}}
    placement: {{process: worker}}
edges:
  - {{from: thinker, to: talker}}
  - {{from: talker, to: code2wav}}
outputs: [thinker, code2wav]
"""


@pytest.fixture
async def graph() -> AsyncIterator[StageGraph]:
    config = parse_graph(GRAPH)
    g = StageGraph(config, build_engines(config))
    await g.start()
    yield g
    await g.close()


def request(rid: str) -> PipelineRequest:
    return PipelineRequest(request_id=rid, audio=np.zeros(1600, dtype=np.int16))


def worker(graph: StageGraph, stage: str) -> WorkerEngine:
    engine = graph.engines[stage]
    assert isinstance(engine, WorkerEngine)
    return engine


async def test_worker_stages_stream_like_in_process_ones(graph: StageGraph) -> None:
    out: list[OutputChunk] = [c async for c in graph.generate(request("resp_a"))]
    assert isinstance(out[-1], End)
    assert [c.text for c in out if isinstance(c, TextDelta)] == [f"W{i} " for i in range(40)]
    audio = [c for c in out if isinstance(c, AudioChunk)]
    assert [int(c.pcm[0]) for c in audio] == list(range(40))
    assert graph.active_requests() == 0
    assert await worker(graph, "thinker").remote_active_requests() == 0


async def test_closing_early_aborts_inside_the_workers(graph: StageGraph) -> None:
    stream = graph.generate(request("resp_b"))
    async for chunk in stream:
        if isinstance(chunk, AudioChunk):
            break
    await stream.aclose()
    assert graph.active_requests() == 0
    for stage in ("thinker", "code2wav"):
        async with asyncio.timeout(5):
            while await worker(graph, stage).remote_active_requests():
                await asyncio.sleep(0.01)


async def test_a_killed_worker_fails_its_requests_and_comes_back(graph: StageGraph) -> None:
    thinker = worker(graph, "thinker")
    old_pid = thinker.pid
    assert old_pid is not None
    stream = graph.generate(request("resp_c"))
    out: list[OutputChunk] = []
    async with asyncio.timeout(10):
        async for chunk in stream:
            out.append(chunk)
            if len(out) == 3:
                os.kill(old_pid, signal.SIGKILL)
    assert isinstance(out[-1], ErrorChunk)
    assert out[-1].stage == "thinker" and "worker stopped" in out[-1].message
    async with asyncio.timeout(20):
        while thinker.pid in (None, old_pid):
            await asyncio.sleep(0.05)
    assert thinker.restarts == 1
    again = [c async for c in graph.generate(request("resp_d"))]
    assert isinstance(again[-1], End)
    assert graph.active_requests() == 0


async def test_a_worker_engine_of_the_wrong_kind_fails_to_start_naming_its_stage() -> None:
    engine = WorkerEngine(WorkerSpec("talker", SCRIPTED_ENTRY, "stream", {"name": "talker"}))
    with pytest.raises(WorkerFailed, match="stage 'talker' has an upstream edge") as caught:
        await engine.start()
    assert "must be a StreamEngine" in str(caught.value) and engine.pid is None
    await engine.close()


async def test_a_start_cancelled_while_the_worker_loads_leaves_no_process() -> None:
    """The server stopped while its models load (Ctrl-C at start, or a readiness timeout):
    the worker that was loading stops with it, and nothing of its link is left open."""
    args = {"start_delay_s": 60.0}
    engine = WorkerEngine(
        WorkerSpec("thinker", "tests.fakes.fake_engine:FakeEngine", "entry", args)
    )
    starting = asyncio.create_task(engine.start())
    async with asyncio.timeout(10):
        while not workers():
            await asyncio.sleep(0.05)
    (pid,) = workers()
    await asyncio.sleep(0.5)  # it is loading
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert not workers() and engine.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    await engine.close()


def workers() -> list[int]:
    """This process's stage workers (a zombie has no command line)."""
    return [pid for pid in tree(os.getpid()) if "pipeline.worker_main" in cmdline(pid)]
