"""Stages in worker processes: same results, abort across the process, restart on death,
and on a hang (the process stopped, or its engine stuck in a step with its loop alive)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
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


HANGING = """\
name: hangs
stages:
  - name: thinker
    engine: "tests.fakes.stage_engines:Sticking"
    engine_args: {count: 100, step_s: 0.02}
    placement: {process: worker}
    hang_s: 2
outputs: [thinker]
"""


@contextlib.asynccontextmanager
async def started(text: str) -> AsyncIterator[StageGraph]:
    """The graph file `text`, built and started; closed at the end."""
    config = parse_graph(text)
    g = StageGraph(config, build_engines(config))
    await g.start()
    try:
        yield g
    finally:
        await g.close()


@pytest.fixture
async def graph() -> AsyncIterator[StageGraph]:
    async with started(GRAPH) as g:
        yield g


def request(rid: str, text: str | None = None) -> PipelineRequest:
    return PipelineRequest(request_id=rid, audio=np.zeros(1600, dtype=np.int16), text=text)


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


@pytest.fixture
async def hanging() -> AsyncIterator[StageGraph]:
    async with started(HANGING) as g:
        yield g


async def fail_and_replace(
    graph: StageGraph, stream: AsyncIterator[OutputChunk], old_pid: int, since: float
) -> tuple[ErrorChunk, float, float]:
    """The rest of a hung request (its ErrorChunk), then the stage down until a new worker
    serves: new requests fail at once and `stalled_stages` names the stage meanwhile.
    Returns the error and the seconds from `since` to it and to the new worker's start."""
    async with asyncio.timeout(15):  # the bound is 2 s; never the 30 s chunk deadline
        rest = [chunk async for chunk in stream]
    failed = time.monotonic() - since
    error = rest[-1]
    assert isinstance(error, ErrorChunk) and error.stage == "thinker"
    assert "thinker stage stopped answering (hung: " in error.message
    thinker = worker(graph, "thinker")
    assert "thinker" in graph.stalled_stages()
    started = time.monotonic()
    down = [c async for c in graph.generate(request("resp_while_down"))]
    assert isinstance(down[-1], ErrorChunk) and "not answering (hung: " in down[-1].message
    assert time.monotonic() - started < 1.0  # fast, not silence
    async with asyncio.timeout(30):
        while thinker.pid in (None, old_pid) or thinker.down_reason is not None:
            await asyncio.sleep(0.05)
    replaced = time.monotonic() - since
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)  # killed and reaped, not left stopped
    assert graph.stalled_stages() == {}
    again = [c async for c in graph.generate(request("resp_after"))]
    assert isinstance(again[-1], End)
    return error, failed, replaced


async def test_a_stopped_worker_fails_its_requests_within_seconds_and_is_replaced(
    hanging: StageGraph,
) -> None:
    old_pid = worker(hanging, "thinker").pid
    assert old_pid is not None
    stream = hanging.generate(request("resp_stopped"))
    for _ in range(3):
        assert isinstance(await anext(stream), TextDelta)
    os.kill(old_pid, signal.SIGSTOP)
    stopped = time.monotonic()
    error, failed, replaced = await fail_and_replace(hanging, stream, old_pid, stopped)
    assert "no word from it for 2 s" in error.message
    assert failed < 2 + 3
    print(f"SIGSTOP: failed after {failed:.2f} s, replacement serving after {replaced:.2f} s")


async def test_an_engine_stuck_in_a_step_while_its_loop_lives_is_found_and_replaced(
    hanging: StageGraph,
) -> None:
    old_pid = worker(hanging, "thinker").pid
    assert old_pid is not None
    stream = hanging.generate(request("resp_stuck", text="stick"))
    for _ in range(3):
        assert isinstance(await anext(stream), TextDelta)
    stuck = time.monotonic()  # within one step (20 ms) of the stuck one's start
    error, failed, replaced = await fail_and_replace(hanging, stream, old_pid, stuck)
    assert "the sticking thread has made no progress for" in error.message
    assert failed < 2 + 3
    print(f"stuck step: failed after {failed:.2f} s, replacement serving after {replaced:.2f} s")


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
