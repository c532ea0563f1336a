"""A stage on "another host": served over Redis streams by `serve_remote_stage`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.graph import StageGraph
from pipeline.graph_config import load_graph
from pipeline.registry import build_engines
from pipeline.remote import LIVENESS_S
from pipeline.remote_stage import serve_remote_stage
from pipeline.types import AudioChunk, End, ErrorChunk, OutputChunk, PipelineRequest, TextDelta
from tests.redis_process import RedisProcess

SCRIPTED = "tests.fakes.stage_engines:ScriptedStage"
SCRIPTED_ENTRY = "tests.fakes.stage_engines:ScriptedEntry"
PARLEY = str(Path(sys.executable).parent / "parley")
ROOT = str(Path(__file__).parents[2])


def graph_file(tmp_path: Path, count: int = 12, delay_s: float = 0.0) -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text(
        f"""\
name: remote-test
stages:
  - name: thinker
    engine: "{SCRIPTED_ENTRY}"
    engine_args: {{name: thinker, count: {count}, delay_s: {delay_s}}}
    placement: {{process: remote, link: test-thinker}}
  - name: code2wav
    engine: "{SCRIPTED}"
    engine_args: {{name: code2wav, emit: audio}}
edges:
  - {{from: thinker, to: code2wav}}
outputs: [thinker, code2wav]
"""
    )
    return path


async def test_a_remote_stage_serves_the_graph_over_redis(tmp_path: Path, redis_url: str) -> None:
    path = graph_file(tmp_path)
    config = load_graph(path)
    graph = StageGraph(config, build_engines(config, redis_url))
    await graph.start()
    other_host = asyncio.create_task(serve_remote_stage(str(path), "thinker", redis_url))
    try:
        request = PipelineRequest(request_id="resp_r", audio=np.zeros(320, dtype=np.int16))
        async with asyncio.timeout(10):
            out = [c async for c in graph.generate(request)]
        assert isinstance(out[-1], End)
        assert [c.text for c in out if isinstance(c, TextDelta)] == [f"W{i} " for i in range(12)]
        assert len([c for c in out if isinstance(c, AudioChunk)]) == 12
    finally:
        await graph.close()
        async with asyncio.timeout(5):
            await other_host  # the link closed: the remote side stops serving


async def answer(graph: StageGraph, rid: str) -> list[OutputChunk]:
    request = PipelineRequest(request_id=rid, audio=np.zeros(320, dtype=np.int16))
    return [c async for c in graph.generate(request)]


async def answered_again(graph: StageGraph, within_s: float) -> None:
    """Ask until an answer comes through whole (the stage is back)."""
    async with asyncio.timeout(within_s):
        for attempt in range(10_000):
            out = await answer(graph, f"resp_again_{attempt}")
            if isinstance(out[-1], End):
                return
            await asyncio.sleep(0.2)


@pytest.fixture
async def remote_graph(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[StageGraph, Path]]:
    path = graph_file(tmp_path, count=60, delay_s=0.05)
    config = load_graph(path)
    graph = StageGraph(config, build_engines(config, redis_url))
    await graph.start()
    try:
        yield graph, path
    finally:
        await graph.close()


@pytest.fixture
def stage_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """`parley stage` processes; each stops by itself once the main side closes the link
    (and so deletes the link's keys), so ask for this fixture before the graph's."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def parley_stage(path: Path, redis_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PARLEY, "stage", "--redis-url", redis_url, "--pipeline", str(path), "--stage", "thinker"],
        env={**os.environ, "PYTHONPATH": ROOT},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
async def test_a_killed_remote_stage_fails_fast_and_is_used_again_when_it_returns(
    stage_processes: list[subprocess.Popen[bytes]],
    remote_graph: tuple[StageGraph, Path],
    redis_url: str,
) -> None:
    graph, path = remote_graph
    stage_processes.append(first := parley_stage(path, redis_url))
    async with asyncio.timeout(30):
        out = await answer(graph, "resp_first")
    assert isinstance(out[-1], End)
    request = PipelineRequest(request_id="resp_cut", audio=np.zeros(320, dtype=np.int16))
    stream = graph.generate(request)
    assert isinstance(await anext(stream), TextDelta)
    first.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    async with asyncio.timeout(LIVENESS_S + 5):  # not the session's 30 s chunk deadline
        rest = [c async for c in stream]
    assert isinstance(rest[-1], ErrorChunk)
    assert "stopped answering" in rest[-1].message
    assert time.monotonic() - killed < LIVENESS_S + 3
    started = time.monotonic()
    out = await answer(graph, "resp_while_down")
    assert isinstance(out[-1], ErrorChunk) and "not answering" in out[-1].message
    assert time.monotonic() - started < 1.0  # fails fast while the stage is down
    stage_processes.append(parley_stage(path, redis_url))
    await answered_again(graph, within_s=30)


@pytest.mark.slow
async def test_a_redis_outage_under_a_remote_stage_is_ridden_out(tmp_path: Path) -> None:
    own = RedisProcess()
    own.start()
    path = graph_file(tmp_path, count=60, delay_s=0.05)
    config = load_graph(path)
    graph = StageGraph(config, build_engines(config, own.url))
    other_host: asyncio.Task[None] | None = None
    try:
        await graph.start()
        other_host = asyncio.create_task(serve_remote_stage(str(path), "thinker", own.url))
        async with asyncio.timeout(10):
            assert isinstance((await answer(graph, "resp_before"))[-1], End)
        request = PipelineRequest(request_id="resp_cut", audio=np.zeros(320, dtype=np.int16))
        stream = graph.generate(request)
        assert isinstance(await anext(stream), TextDelta)
        own.kill()
        async with asyncio.timeout(LIVENESS_S + 8):
            rest = [c async for c in stream]
        assert isinstance(rest[-1], ErrorChunk)
        out = await answer(graph, "resp_during")
        assert isinstance(out[-1], ErrorChunk)
        assert not other_host.done()  # the remote side waits for Redis, it does not exit
        own.start()  # an empty Redis on the same socket, as after a restart
        await answered_again(graph, within_s=30)
    finally:
        await graph.close()
        if other_host is not None:
            async with asyncio.timeout(10):
                await other_host  # the main side closed the link: the remote side stops
        own.close()
