"""The stage graph runtime: order, streaming, backpressure, abort, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from pipeline.graph import StageGraph
from pipeline.graph_config import GraphConfigError, parse_graph
from pipeline.types import AudioChunk, End, ErrorChunk, OutputChunk, PipelineRequest, TextDelta
from tests.fakes.stage_engines import Scripted, ScriptedEntry, ScriptedStage

THREE_STAGES = """\
name: three
stages:
  - {name: thinker, engine: scripted}
  - {name: talker, engine: scripted}
  - {name: code2wav, engine: scripted}
edges:
  - {from: thinker, to: talker, transform: "pipeline.transforms:passthrough"}
  - {from: talker, to: code2wav, chunk: 2}
outputs: [thinker, code2wav]
"""


def build(**engines: Scripted) -> StageGraph:
    return StageGraph(parse_graph(THREE_STAGES), dict(engines), channel_size=4)


def request(rid: str = "resp_1") -> PipelineRequest:
    return PipelineRequest(request_id=rid, audio=np.zeros(0, dtype=np.int16))


def engines(**overrides: Any) -> dict[str, Scripted]:
    made: dict[str, Scripted] = {
        "thinker": ScriptedEntry("thinker", count=6, delay_s=0.01),
        "talker": ScriptedStage("talker"),
        "code2wav": ScriptedStage("code2wav", emit="audio"),
    }
    for name, kwargs in overrides.items():
        made[name] = type(made[name])(name, **kwargs)
    return made


async def test_chunks_flow_in_order_and_downstream_starts_early() -> None:
    e = engines()
    graph = build(**e)
    out: list[OutputChunk] = [c async for c in graph.generate(request())]
    assert isinstance(out[-1], End)
    texts = [c.text for c in out if isinstance(c, TextDelta)]
    assert texts == [f"W{i} " for i in range(6)]
    audio = [int(c.pcm[0]) for c in out if isinstance(c, AudioChunk)]
    assert audio == list(range(6))
    # "async chunk": the talker got its first chunk long before the thinker finished.
    assert e["talker"].first_input_at is not None and e["thinker"].finished_at is not None
    assert e["talker"].first_input_at < e["thinker"].finished_at - 0.03
    assert graph.active_requests() == 0


async def test_a_slow_consumer_keeps_memory_bounded() -> None:
    e = engines(thinker={"count": 10_000})
    graph = build(**e)
    stream = graph.generate(request())
    read = 0
    async for _ in stream:
        read += 1
        await asyncio.sleep(0.005)
        if read == 30:
            break
    await stream.aclose()
    # Everything produced but not read sits in bounded channels (4 per edge + the output).
    assert e["thinker"].produced <= read + 4 * 4
    assert graph.active_requests() == 0


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
async def test_closing_during_each_stage_aborts_everywhere(stage: str) -> None:
    e = engines(thinker={"count": 1_000, "delay_s": 0.002})
    graph = build(**e)
    stream = graph.generate(request())
    async for _ in stream:
        if e[stage].produced >= 3:
            break
    await stream.aclose()
    assert graph.active_requests() == 0
    for engine in e.values():
        assert engine.active_requests() == 0
    assert "resp_1" in e["thinker"].stopped_early


async def test_cancelling_the_reader_aborts_everywhere() -> None:
    e = engines(thinker={"count": 1_000, "delay_s": 0.002})
    graph = build(**e)

    async def read() -> None:
        async for _ in graph.generate(request()):
            pass

    task = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait({task})
    assert graph.active_requests() == 0
    assert all(engine.produced > 0 for engine in e.values())


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
async def test_a_failing_stage_sends_one_error_and_nothing_hangs(stage: str) -> None:
    e = engines(**{stage: {"fail_at": 2, "emit": "audio" if stage == "code2wav" else "text"}})
    graph = build(**e)
    async with asyncio.timeout(5):
        out = [c async for c in graph.generate(request())]
    errors = [c for c in out if isinstance(c, ErrorChunk)]
    assert len(errors) == 1 and out[-1] is errors[0]
    assert errors[0].stage == stage and "broke at chunk 2" in errors[0].message
    assert graph.active_requests() == 0


async def test_concurrent_requests_are_independent() -> None:
    graph = build(**engines())
    results = await asyncio.gather(*[_collect(graph, f"resp_{i}") for i in range(5)])
    for out in results:
        assert [c.text for c in out if isinstance(c, TextDelta)] == [f"W{i} " for i in range(6)]
    assert graph.active_requests() == 0


async def _collect(graph: StageGraph, rid: str) -> list[OutputChunk]:
    return [c async for c in graph.generate(request(rid))]


@pytest.mark.parametrize(
    ("stage", "wrong", "needs"),
    [
        ("talker", ScriptedEntry("talker"), "must be a StreamEngine"),
        ("thinker", ScriptedStage("thinker"), "must be an EntryEngine"),
    ],
)
def test_an_engine_of_the_wrong_kind_is_refused_when_the_graph_is_built(
    stage: str, wrong: Scripted, needs: str
) -> None:
    made = engines()
    made[stage] = wrong
    with pytest.raises(GraphConfigError) as caught:
        build(**made)
    assert f"stage {stage!r}" in str(caught.value) and needs in str(caught.value)
    assert caught.value.field == f"stages.{['thinker', 'talker', 'code2wav'].index(stage)}.engine"
