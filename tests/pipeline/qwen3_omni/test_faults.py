"""The tiny Qwen3-Omni with its Talker in a worker process, whose device fails stickily.

A real sticky CUDA error needs a GPU; the model thread's test hook (`device_faults.INJECT_ENV`)
raises the message a device-side assert gives on the Talker's thread instead. What a user
would notice is checked: the turn in flight fails with `model_error`, the stage is reported
down (what `/readyz` reads), its process exits by itself and a new one starts, and the next
turn is answered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pipeline.device_faults import INJECT_ENV
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import AudioChunk, End, ErrorChunk, OutputChunk, PipelineRequest
from pipeline.worker import WorkerEngine
from pipeline.worker_main import BROKEN_EXIT

from .conftest import graph_yaml, turn_audio


async def turn(graph: StageGraph, rid: str) -> list[OutputChunk]:
    async with asyncio.timeout(45):
        return [c async for c in graph.generate(PipelineRequest(rid, audio=turn_audio(0.5)))]


@pytest.mark.slow
async def test_a_sticky_error_in_the_talker_fails_the_turn_and_the_next_turn_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "fault"
    monkeypatch.setenv(INJECT_ENV, str(flag))  # the workers inherit it
    config = parse_graph(graph_yaml(placement="worker", tokens=12, frames=12))
    graph = StageGraph(config, build_engines(config))
    await graph.start()
    try:
        talker = graph.engines["talker"]
        assert isinstance(talker, WorkerEngine)
        old_pid = talker.pid
        assert isinstance((await turn(graph, "resp_1"))[-1], End)
        flag.write_text("talker")  # the Talker's next model-thread call fails
        hit = time.monotonic()
        failed = await turn(graph, "resp_2")
        error = failed[-1]
        assert isinstance(error, ErrorChunk) and error.code == "model_error", failed[-1]
        assert error.stage == "talker" and "device-side assert triggered" in error.message
        async with asyncio.timeout(5):
            while "talker" not in graph.stalled_stages():
                await asyncio.sleep(0.02)
        told = time.monotonic() - hit
        async with asyncio.timeout(45):
            while talker.pid in (None, old_pid) or graph.stalled_stages():
                await asyncio.sleep(0.05)
        back = time.monotonic() - hit
        assert talker.last_exit == BROKEN_EXIT
        answered = await turn(graph, "resp_3")
        assert isinstance(answered[-1], End)
        assert any(isinstance(c, AudioChunk) for c in answered)
        print(f"Talker sticky error: reported after {told:.2f} s, serving again after {back:.2f} s")
    finally:
        await graph.close()
