"""The `subgraph` engine: stages grouped into one, placed together (one worker process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import numpy as np
import pytest

from loadtest.omni_bench_options import parser as bench_parser
from loadtest.omni_graph import omni_graph
from pipeline.engines.subgraph import SubgraphEngine
from pipeline.graph import StageGraph
from pipeline.graph_config import GraphConfigError
from pipeline.registry import load_pipeline
from pipeline.types import (
    AudioChunk,
    Chunk,
    End,
    EntryEngine,
    ErrorChunk,
    OutputChunk,
    PipelineRequest,
    TextDelta,
)

ENTRY = "tests.fakes.stage_engines:ScriptedEntry"
STAGE = "tests.fakes.stage_engines:ScriptedStage"


class Fragile(EntryEngine):
    """Answers "ok", or fails a request whose text is "break" (and only that one)."""

    name = "fragile"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    def active_requests(self) -> int:
        return 0

    async def generate(
        self, request_id: str, request: PipelineRequest, /
    ) -> AsyncGenerator[Chunk, None]:
        if request.text == "break":
            raise RuntimeError("the kernel fell over")
        yield TextDelta(text="ok")
        yield End()


def request(rid: str, text: str = "hello") -> PipelineRequest:
    return PipelineRequest(request_id=rid, audio=np.zeros(1600, np.int16), text=text)


async def collect(graph: StageGraph, req: PipelineRequest) -> list[OutputChunk]:
    return [chunk async for chunk in graph.generate(req)]


def test_its_stages_must_run_where_it_runs() -> None:
    with pytest.raises(GraphConfigError, match="talker: a subgraph's stages run where"):
        SubgraphEngine(
            stages=[
                {"name": "thinker", "engine": ENTRY},
                {"name": "talker", "engine": STAGE, "placement": {"process": "worker"}},
            ],
            edges=[{"from": "thinker", "to": "talker"}],
            outputs=["talker"],
        )


def test_a_bad_inner_graph_names_the_field() -> None:
    with pytest.raises(GraphConfigError, match="outputs"):
        SubgraphEngine(stages=[{"name": "thinker", "engine": ENTRY}], outputs=["nobody"])


async def test_two_stages_answer_as_one_and_hold_nothing_after() -> None:
    group = SubgraphEngine(
        stages=[
            {"name": "thinker", "engine": ENTRY, "engine_args": {"name": "thinker", "count": 3}},
            {"name": "talker", "engine": STAGE, "engine_args": {"name": "talker"}},
        ],
        edges=[{"from": "thinker", "to": "talker"}],
        outputs=["thinker", "talker"],
    )
    await group.start()
    try:
        chunks = [c async for c in group.generate("r1", request("r1"))]
        texts = [c.text for c in chunks if isinstance(c, TextDelta)]
        assert sorted(texts) == sorted(["W0 ", "W1 ", "W2 ", "W0 ", "W1 ", "W2 "])
        assert isinstance(chunks[-1], End)
        assert group.active_requests() == 0
        assert group.graph is not None and group.graph.active_requests() == 0
    finally:
        await group.close()
        await group.close()  # idempotent


async def test_a_failing_request_fails_alone_in_a_worker(tmp_path: Path) -> None:
    """A group in a worker process: a request its stage fails on ends with that error, and
    the group (the same process) answers the next one."""
    graph_file = tmp_path / "group.yaml"
    graph_file.write_text(
        "name: grouped\n"
        "stages:\n"
        "  - name: group\n"
        "    engine: subgraph\n"
        "    engine_args:\n"
        "      stages: [{name: model, engine: 'tests.pipeline.test_subgraph:Fragile'}]\n"
        "      outputs: [model]\n"
        "    placement: {process: worker}\n"
        "outputs: [group]\n"
    )
    graph = load_pipeline(str(graph_file))
    assert isinstance(graph, StageGraph)
    await graph.start()
    try:
        broken = await collect(graph, request("r1", "break"))
        assert isinstance(broken[-1], ErrorChunk)
        assert "the kernel fell over" in broken[-1].message
        fine = await collect(graph, request("r2"))
        assert [c.text for c in fine if isinstance(c, TextDelta)] == ["ok"]
        assert isinstance(fine[-1], End)
    finally:
        await graph.close()


def tiny_omni(placement: str) -> str:
    """The omni bench's graph of the tiny Qwen3-Omni: its three stages in this process
    (`main`), or grouped in one worker process (`subgraph`)."""
    args = bench_parser().parse_args(
        ["--pipeline", "qwen3_omni_tiny", "--placement", placement,
         "--think-tokens", "6", "--speech-s", "1", "--concurrency", "1",
         "--set", "thinker.decode_rows=2", "--set", "talker.decode_rows=2"]
    )  # fmt: skip
    return omni_graph(args).text()


@pytest.mark.slow
async def test_qwen3_omni_grouped_in_one_worker_says_what_the_flat_graph_says(
    tmp_path: Path,
) -> None:
    """The same tiny model (seeded weights, greedy), its three stages in this process or
    grouped in one worker process: the same words and the same audio."""
    heard: dict[str, tuple[list[str], np.ndarray]] = {}
    for placement in ("main", "subgraph"):
        path = tmp_path / f"{placement}.yaml"
        path.write_text(tiny_omni(placement))
        graph = load_pipeline(str(path))
        assert isinstance(graph, StageGraph)
        await graph.start()
        try:
            chunks = await collect(graph, request(f"{placement}_1", "What do you see?"))
            assert isinstance(chunks[-1], End), chunks[-1]
            words = [c.text for c in chunks if isinstance(c, TextDelta) and c.kind == "output"]
            # a copy: chunks from a worker are views onto its link's ring, gone at close
            pcm = np.concatenate([c.pcm for c in chunks if isinstance(c, AudioChunk)])
            heard[placement] = (words, pcm)
        finally:
            await graph.close()
    assert heard["main"][0] == heard["subgraph"][0] and len(heard["main"][0]) == 6
    np.testing.assert_array_equal(heard["main"][1], heard["subgraph"][1])


async def test_an_inner_stage_stuck_in_a_step_stalls_the_group() -> None:
    """The hung-stage watch asks the group: a stuck inner stage answers for it, by name."""
    group = SubgraphEngine(
        stages=[
            {
                "name": "model",
                "engine": "tests.fakes.stage_engines:Sticking",
                "hang_s": 0.2,
            }
        ],
        outputs=["model"],
    )
    await group.start()
    stream = group.generate("r1", request("r1", "stick"))
    try:
        assert group.stalled(0.2) is None
        await anext(stream)  # the first steps go, then one never returns
        async with asyncio.timeout(10):
            while (reason := group.stalled(0.2)) is None:
                await asyncio.sleep(0.05)
        assert reason.startswith("model: ")
    finally:
        await group.close()  # lets the stuck step go
        await stream.aclose()
