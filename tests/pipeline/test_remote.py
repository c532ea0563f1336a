"""A stage on "another host": served over Redis streams by `serve_remote_stage`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from pipeline.graph import StageGraph
from pipeline.graph_config import load_graph
from pipeline.registry import build_engines
from pipeline.remote import serve_remote_stage
from pipeline.types import AudioChunk, End, PipelineRequest, TextDelta

SCRIPTED = "tests.fakes.stage_engines:ScriptedStage"


def graph_file(tmp_path: Path) -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text(
        f"""\
name: remote-test
stages:
  - name: thinker
    engine: "{SCRIPTED}"
    engine_args: {{name: thinker, count: 12}}
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
