"""A stage in the server's own process whose engine broke (a sticky device error): the
server logs why and exits with status 3 for its supervisor to start it again.

The error is the model thread's fake one (`device_faults.INJECT_ENV`); the exit itself is
caught here (`os._exit` replaced) so that the test process lives on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from pipeline.device_faults import INJECT_ENV
from pipeline.graph import StageGraph
from pipeline.graph_config import parse_graph
from pipeline.registry import build_engines
from pipeline.types import ErrorChunk, PipelineRequest
from pipeline.worker_main import BROKEN_EXIT
from web import broken_stages

GRAPH = """\
name: in_process
stages:
  - name: thinker
    engine: "tests.fakes.stage_engines:Breaking"
    engine_args: {count: 5, step_s: 0.001}
outputs: [thinker]
"""


class Exited(Exception):
    pass


async def test_a_broken_stage_in_the_server_process_exits_it_with_status_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    flag = tmp_path / "fault"
    monkeypatch.setenv(INJECT_ENV, str(flag))
    monkeypatch.setattr(broken_stages, "GRACE_S", 0.05)
    statuses: list[int] = []

    def exit_now(status: int) -> None:
        statuses.append(status)
        raise Exited

    monkeypatch.setattr(os, "_exit", exit_now)
    config = parse_graph(GRAPH)
    graph = StageGraph(config, build_engines(config))
    await graph.start()
    try:
        watch = asyncio.create_task(broken_stages.exit_when_broken(graph, poll_s=0.02))
        await asyncio.sleep(0.1)
        assert not watch.done()  # a working stage: nothing happens
        flag.write_text("")
        request = PipelineRequest("resp_1", np.zeros(160, dtype=np.int16))
        out = [chunk async for chunk in graph.generate(request)]
        assert isinstance(out[-1], ErrorChunk) and out[-1].code == "model_error"
        assert "thinker" in graph.stalled_stages()
        with pytest.raises(Exited):
            async with asyncio.timeout(5):
                await watch
        assert statuses == [BROKEN_EXIT]
        assert "stage thinker in this server process is broken" in caplog.text
    finally:
        await graph.close()
